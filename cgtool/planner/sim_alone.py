"""The first requests of a trace served by themselves, taken from the run of the whole trace.

A plan serves its fit requests (those before the held-out split) by themselves as well as the
whole trace, with the same schedule. Until the first later request arrives, the two runs take
the same steps: the scheduler reads a request only once it has arrived, so the first step
where they can part is a decode run that would reach that arrival, an idle wait for it, or any
step once the clock has passed it (cgtool.planner.simulator's three checks). The run forks
there (os.fork, which copies the loop's state for nothing): the child forgets the later
requests, runs on alone and sends its result through a pipe; the parent goes on with every
request. The steps before the fork are simulated once. The child's run is the run of the first
requests by themselves, step for step: the same lists, the same arithmetic in the same order.

While the plan searches for the number of replicas, a round whose first requests' run overloads
at any load is simulated again at more replicas, and only those runs of it are read. Such a
run raises a flag shared by the round's processes (DropWhole), and each whole run, once forked,
stops at its next poll of `stop`: on the million-request benchmark the whole runs went on for
4-6 s after the 2x load's first requests were done (2-core CPU, 2026-11-26).
"""

from __future__ import annotations

import math
import mmap
import os
import pickle
import signal
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cgtool.planner.sim_requests import NEVER_FITS, NEVER_MS, Prepared
from cgtool.planner.sim_result import RunTallies, build_result

# Reads and writes on the pipe, in bytes at a time.
_CHUNK = 1 << 20
# Below this many first requests, simulating them apart (about 20 ms) costs less than a fork of
# a process holding a trace: 30 ms with a million requests' lists (2-core CPU, 2026-11-26).
FORK_MIN_REQUESTS = 10_000


@dataclass(frozen=True, eq=False)
class DropWhole:
    """The whole runs of one round stop once `redo` (of a first requests' run) says the round
    is simulated again; `flag` is shared by every process the round forks."""

    redo: Callable[[object], bool]
    flag: mmap.mmap

    @staticmethod
    def shared_flag() -> mmap.mmap:
        return mmap.mmap(-1, 1)  # anonymous and MAP_SHARED: children's writes reach everyone

    def raised(self) -> bool:
        return self.flag[0] == 1


@dataclass(slots=True)
class AloneFork:
    """Where the whole run forks, and the pipe its child sends the run alone through."""

    index: int  # the first later request among those kept: from it on, none arrives alone
    at_ms: float  # its arrival: no step before it can differ
    given: int  # the first requests, of those given (kept or dropped)
    read_fd: int = -1
    write_fd: int = -1
    pid: int = 0  # the child's, in the parent once forked
    in_child: bool = False
    drop: DropWhole | None = None

    def fork(self) -> bool:
        """Fork once; True in the child."""
        self.read_fd, self.write_fd = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            self.in_child = True
            os.close(self.read_fd)
            # Ctrl-C is the parent's to answer: its run stops, and it ends this child (discard).
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            return True
        os.close(self.write_fd)
        return False

    def prefix(self, kept: Prepared) -> Prepared:
        """The kept requests of the first `given`, as prepare() makes them on their own."""
        k = self.index
        return Prepared(kept.requests, self.given - k, kept.index[:k], kept.origin_s,
                        kept.footprint[:k], kept.output_tokens[:k])

    def finish_child(self, tallies: RunTallies, kept: Prepared) -> None:
        """In the child, once its loop ended: its result, for the first requests, to the parent."""
        try:
            tallies.finish_ms = tallies.finish_ms[: self.index]
            result: object = build_result(tallies, self.prefix(kept), False)
            if self.drop is not None and self.drop.redo(result):
                self.drop.flag[0] = 1
        except BaseException as exc:  # noqa: BLE001 - the parent raises it
            result = exc
        self.send_and_exit(result)

    def dropped(self) -> bool:
        """In the parent: whether its whole run stopped because the round is redone."""
        return self.pid != 0 and self.drop is not None and self.drop.raised()

    def discard(self) -> None:
        """In the parent, when its run was stopped or failed: end the child unread."""
        if self.pid:
            os.kill(self.pid, signal.SIGKILL)
            os.close(self.read_fd)
            os.waitpid(self.pid, 0)
            self.pid = 0

    def send_and_exit(self, result: object) -> None:
        """In the child: the result (or the error) to the parent, then exit at once, running
        none of the parent's clean-up."""
        try:
            data = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
            view = memoryview(data)
            while view:
                view = view[os.write(self.write_fd, view[:_CHUNK]):]
        finally:
            os._exit(0)

    def receive(self) -> object:
        """In the parent: what the child sent (None when it died first)."""
        if self.pid == 0:
            return None
        parts = []
        while chunk := os.read(self.read_fd, _CHUNK):
            parts.append(chunk)
        os.close(self.read_fd)
        os.waitpid(self.pid, 0)
        result = pickle.loads(b"".join(parts)) if parts else None
        if isinstance(result, Exception):
            raise result
        return result


def alone_fork(
    kept: Prepared, given: int, arrival_s: np.ndarray, split_ms: float, forkable: bool,
    drop: DropWhole | None = None,
) -> AloneFork | None:
    """The fork for the first `given` requests, or None where the whole run cannot stand for
    them: arrivals out of order (the first given are not the first to arrive), no later request
    kept, none of them kept, or a held-out split that cuts a step before the fork."""
    if not forkable or not hasattr(os, "fork") or given < FORK_MIN_REQUESTS:
        return None
    arrival = np.asarray(arrival_s)
    if not np.all(arrival[1:] >= arrival[:-1]):
        return None
    index = int(np.searchsorted(kept.index, given))  # kept.index ascends: arrivals in order
    if index == 0 or index >= len(kept.index):
        return None
    at_ms = kept.requests.arrival_ms[index]
    if split_ms < at_ms:
        return None
    return AloneFork(index, at_ms, given, drop=drop)


Stop = Callable[[], bool] | None


def go_alone(
    fork: AloneFork, arrival_ms: list[float], footprint: list[int], split_ms: float,
    progress: object, stop: Stop,
) -> tuple[float, object, Stop]:
    """Fork the run; the loop's (split_ms, progress, stop) from here on. In the child, the
    requests from `fork.index` on never arrive and never fit, as past the end of a trace of the
    first ones alone, with no split, progress or stop. In the parent, `stop` also fires once
    the round is to be simulated again (DropWhole)."""
    if not fork.fork():
        drop = fork.drop
        if drop is None:
            return split_ms, progress, stop
        return split_ms, progress, lambda: drop.raised() or (stop is not None and stop())
    k = fork.index
    del arrival_ms[k + 1:], footprint[k + 1:]
    arrival_ms[k], footprint[k] = NEVER_MS, NEVER_FITS
    return math.inf, None, None
