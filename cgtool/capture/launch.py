"""Start one process per tensor-parallel rank, relay rank 0's progress, end every rank on a failure.

The calling process is only the coordinator: it never joins the process group, so a rank
that fails (or dies) cannot leave it stuck inside a collective. It waits for messages from
the ranks, hands rank 0's progress to the callback, returns rank 0's result, and on the first
error stops every rank and raises that rank's message.
"""

from __future__ import annotations

import os
import pickle
import queue as queue_module
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cgtool.errors import CgtoolError, ConfigError, EnvironmentProblem, InputError

# target(rank, size, init_method, channel, *args): runs in every rank's process
RankTarget = Callable[..., None]

_ERRORS = {cls.__name__: cls for cls in (CgtoolError, ConfigError, EnvironmentProblem, InputError)}
_GRACE_S = 1.0  # after a first error, how long to wait for an earlier one from another rank
_PARTIAL_GRACE_S = 20.0  # after Ctrl-C, how long ranks get to send what they measured


@dataclass
class RankChannel:
    """What a rank sends to the coordinator: progress (rank 0 only), its result, or its error."""

    queue: Any
    rank: int

    def progress(self, event: object) -> None:
        if self.rank == 0:
            self.queue.put(("progress", self.rank, event))

    def result(self, value: object) -> None:
        """Rank 0's value is the run's result; the other ranks' are dropped here (nobody would
        read them, and a large unread message blocks its sender's exit)."""
        if self.rank == 0:
            # Plain pickle, not torch's: tensors travel as bytes, not as shared memory that
            # the coordinator would have to attach to after this process has exited.
            self.queue.put(("result", self.rank, pickle.dumps(value)))

    def error(self, kind: str, message: str, remedy: str) -> None:
        self.queue.put(("error", self.rank, (time.time(), kind, message, remedy)))

    def partial(self, value: object) -> None:
        """What this rank measured before it was stopped; every rank sends its own."""
        self.queue.put(("partial", self.rank, pickle.dumps(value)))


def run_ranks(
    target: RankTarget,
    size: int,
    args: tuple[Any, ...],
    on_progress: Callable[[Any], None] = lambda event: None,
    log_dir: Path | None = None,
) -> Any:
    """Run `target` in `size` spawned processes and return rank 0's result.

    Each rank's stdout and stderr go to `log_dir/rank<N>.log` when given (not with
    CGTOOL_DEBUG=1, which leaves them on the terminal and prints tracebacks).
    """
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    channel_queue = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="cgtool-tp-") as store:
        # A file store: no TCP port to pick, so two runs on one machine cannot collide.
        init_method = f"file://{store}/rendezvous"
        procs = mp.start_processes(
            _rank_entry, args=(target, size, init_method, channel_queue, log_dir, args),
            nprocs=size, join=False, start_method="spawn",
        )
        try:
            result = _relay(procs.processes, channel_queue, on_progress, log_dir)
        except KeyboardInterrupt as interrupt:
            # The interruption itself goes on up (its type names the signal), carrying what
            # each rank that answered in time had measured, by rank.
            interrupt.rank_partials = _collect_partials(procs.processes, channel_queue)  # type: ignore[attr-defined]
            _stop(procs.processes, grace_s=0.0)
            raise
        except BaseException:
            _stop(procs.processes, grace_s=0.0)  # a rank failed: no rank may linger
            raise
        _stop(procs.processes, grace_s=30.0)  # the others are leaving the group: let them
        return result


def _rank_entry(
    rank: int, target: RankTarget, size: int, init_method: str, channel_queue: Any,
    log_dir: Path | None, args: tuple[Any, ...],
) -> None:
    # Ctrl-C reaches every process of the terminal's group: the coordinator decides, and
    # stops us with SIGTERM, which the target sees as KeyboardInterrupt and answers with
    # channel.partial().
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _interrupt)
    debug = bool(os.environ.get("CGTOOL_DEBUG"))
    if log_dir is not None and not debug:
        _redirect_output(log_dir / f"rank{rank}.log")
    channel = RankChannel(channel_queue, rank)
    try:
        target(rank, size, init_method, channel, *args)
        _leave_together()
    except KeyboardInterrupt:
        pass  # stopped by the coordinator; the target sent its partial result
    except CgtoolError as exc:
        channel.error(type(exc).__name__, exc.message, exc.remedy)
    except BaseException as exc:  # noqa: BLE001 - anything else still ends every rank with one sentence
        traceback.print_exc()
        first_line = (str(exc).strip().splitlines() or [""])[0][:300]
        where = f"the traceback is in {log_dir / f'rank{rank}.log'}" if log_dir and not debug else (
            "run again with CGTOOL_DEBUG=1 for the traceback")
        channel.error("CgtoolError", f"{type(exc).__name__}: {first_line}".rstrip(": "),
                      f"This is a bug or an environment problem; {where}.")
    finally:
        channel_queue.close()
        channel_queue.join_thread()  # the message must leave before the process does
        sys.stdout.flush()
        sys.stderr.flush()
        # No teardown: the process group's destructor may wait for peers that have left.
        os._exit(0)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _collect_partials(procs: list[Any], channel_queue: Any) -> dict[int, Any]:
    """Ask every running rank to stop and gather the partial results they send back."""
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    partials: dict[int, Any] = {}
    deadline = time.monotonic() + _PARTIAL_GRACE_S
    gone = False  # every rank has left: what they sent is in the pipe, read until it is empty
    while time.monotonic() < deadline and len(partials) < len(procs):
        try:
            kind, rank, payload = channel_queue.get(timeout=0.2)
        except queue_module.Empty:
            if gone:
                break
            # A rank that left had flushed its message (join_thread) but the read above may
            # have timed out just before it arrived: one more read after they have all left.
            gone = not any(proc.is_alive() for proc in procs)
            continue
        if kind == "partial":
            partials[rank] = pickle.loads(payload)
    return partials


def _leave_together() -> None:
    """Wait until every rank is done. Collectives are queued asynchronously on the GPU: a rank
    that exits as soon as its Python returns takes its queued share of the last collectives
    with it, and the ranks still running them wait forever."""
    import torch

    from cgtool.runtime.distributed import barrier

    barrier()
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _redirect_output(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _relay(procs: list[Any], channel_queue: Any, on_progress: Callable[[Any], None],
           log_dir: Path | None) -> Any:
    errors: list[tuple[float, int, str, str, str]] = []
    first_error_at: float | None = None
    while True:
        try:
            kind, rank, payload = channel_queue.get(timeout=0.2)
        except queue_module.Empty:
            kind = None
        if kind == "progress":
            on_progress(payload)
        elif kind == "result" and rank == 0:
            return pickle.loads(payload)
        elif kind == "error":
            errors.append((payload[0], rank, *payload[1:]))
            first_error_at = first_error_at or time.monotonic()
        if errors and time.monotonic() - (first_error_at or 0.0) > _GRACE_S:
            _raise_first(errors)
        if kind is None and not errors:
            _check_alive(procs, log_dir)


def _raise_first(errors: list[tuple[float, int, str, str, str]]) -> None:
    # The earliest failure is the cause; the others are ranks losing their peer.
    _, rank, kind, message, remedy = min(errors)
    raise _ERRORS.get(kind, CgtoolError)(f"rank {rank}: {message}", remedy)


def _check_alive(procs: list[Any], log_dir: Path | None) -> None:
    for rank, proc in enumerate(procs):
        if proc.exitcode not in (None, 0):
            how = (f"was killed by signal {-proc.exitcode}" if proc.exitcode < 0
                   else f"exited with code {proc.exitcode}")
            see = f"See {log_dir / f'rank{rank}.log'}." if log_dir else "Run again with CGTOOL_DEBUG=1."
            raise EnvironmentProblem(f"rank {rank} {how} before it finished", see)
    if all(proc.exitcode == 0 for proc in procs):
        raise EnvironmentProblem("every rank exited without a result from rank 0",
                                 "Run again with CGTOOL_DEBUG=1 to see the ranks' output.")


def _stop(procs: list[Any], grace_s: float) -> None:
    """Let ranks that are finishing exit; terminate, then kill, the ones still running."""
    deadline = time.monotonic() + grace_s
    for proc in procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    for proc in procs:
        proc.join(timeout=5.0)
        if proc.is_alive():
            proc.kill()
            proc.join()
