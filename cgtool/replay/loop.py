"""The continuous-batching loop: the policy's steps run for real on cgtool's model and KV pool.

Each turn asks the scheduler for a step at the wall-clock time since the start, builds its
ForwardBatch, runs it through a graph when the set has one that fits (decode graphs padded to
the next captured batch size, piecewise graphs to the next token count) and eagerly beyond,
and reads the next token of every request on the host, as an engine samples. Requests carry
random prompt tokens; their output length is the trace's (no stop token ends one early).
KV slots are reserved at admission for prompt and whole output, as the policy counts them,
and freed at finish; rows of req_to_token likewise.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from cgtool.errors import EnvironmentProblem
from cgtool.replay.policy import Requests, Scheduler, Step
from cgtool.replay.result import RequestLog, StepLog
from cgtool.replay.virtual import record_times
from cgtool.runtime.engine import ModelRunner, decode_batch, extend_batch
from cgtool.runtime.kv import DUMMY_REQ, DUMMY_SLOT

# How long the loop sleeps at most while waiting for an arrival: short, so a signal or the
# arrival itself is seen promptly; the last bit is spun, since sleep overshoots by ~0.1 ms.
_IDLE_SLEEP_S = 0.005
_SPIN_S = 0.0005


@dataclass
class Graphs:
    """A set's captured runners; None where the set has no graph of that kind."""

    decode: Any = None  # DecodeGraphRunner
    piecewise: Any = None  # PiecewiseGraphRunner or BreakableGraphRunner (prefill graphs)


class Slots:
    """Free KV slots and request rows, handed out at admission and returned at finish."""

    def __init__(self, num_slots: int, num_rows: int) -> None:
        # Slot 0 and row 0 are the dummies padded entries point at: never handed out.
        self.free = np.arange(num_slots - 1, DUMMY_SLOT, -1, dtype=np.int32)  # a stack
        self.top = len(self.free)
        self.rows = list(range(num_rows - 1, DUMMY_REQ, -1))

    def take(self, tokens: int) -> tuple[int, np.ndarray]:
        if tokens > self.top or not self.rows:
            raise EnvironmentProblem("the replay's KV pool ran out of slots or rows",
                                     "Report this: the policy admitted more than the pool holds.")
        self.top -= tokens
        return self.rows.pop(), self.free[self.top : self.top + tokens].copy()

    def give(self, row: int, slots: np.ndarray) -> None:
        self.free[self.top : self.top + len(slots)] = slots
        self.top += len(slots)
        self.rows.append(row)


@dataclass
class LoopState:
    requests: RequestLog
    steps: StepLog = field(default_factory=StepLog)
    stopped: bool = False


class ReplayLoop:
    def __init__(self, runner: ModelRunner, graphs: Graphs, reqs: Requests, scheduler: Scheduler,
                 seed: int = 0) -> None:
        self.runner, self.graphs, self.reqs, self.scheduler = runner, graphs, reqs, scheduler
        pool = runner.kv_pool
        self.slots = Slots(pool.num_slots, pool.max_reqs)
        self.vocab = runner.model.cfg.vocab_size
        self.seed = seed
        self.row: dict[int, int] = {}
        self.held: dict[int, np.ndarray] = {}
        self.prompt_ids: dict[int, np.ndarray] = {}
        self.generated: dict[int, int] = {}  # output tokens so far
        self.last_token: dict[int, int] = {}
        cuda = runner.device.type == "cuda"
        self.sync: Callable[[], None] = torch.cuda.synchronize if cuda else (lambda: None)

    def run(self, stop: Callable[[], bool] = lambda: False,
            progress: Callable[[int, int], None] | None = None,
            clock: Callable[[], float] = time.perf_counter) -> LoopState:
        reqs, sched = self.reqs, self.scheduler
        state = LoopState(RequestLog(list(reqs.arrival_ms), list(reqs.prompt), list(reqs.cached),
                                     list(reqs.output)))
        first: dict[int, float] = {}
        finish: dict[int, float] = {}
        start = clock()
        while not sched.done:
            if stop():
                state.stopped = True
                break
            now = (clock() - start) * 1e3
            step = sched.next_step(now)
            if step is None:
                self._wait(sched.next_arrival_ms(), start, clock)
                continue
            padded = self._run(step)
            end = (clock() - start) * 1e3
            state.steps.append(step.kind, step.size, padded, now, end - now, step.context, step.pairs)
            record_times(sched, step, end, first, finish)
            for i in sched.finished_by(step):
                self._release(i)
            if progress is not None and step.kind == "extend":
                progress(sched.head, len(reqs.prompt))
        state.requests.first_token_ms = [first.get(i) for i in range(len(reqs.prompt))]
        state.requests.finish_ms = [finish.get(i) for i in range(len(reqs.prompt))]
        return state

    def _wait(self, arrival_ms: float | None, start: float, clock: Callable[[], float]) -> None:
        if arrival_ms is None:
            return
        left = start + arrival_ms / 1e3 - clock()
        if left > _SPIN_S:
            time.sleep(min(left - _SPIN_S, _IDLE_SLEEP_S))

    def _run(self, step: Step) -> int:
        for i in step.admitted:
            row, slots = self.slots.take(self.reqs.footprint(i))
            self.row[i], self.held[i] = row, slots
            self.runner.kv_pool.req_to_token[row, : len(slots)] = torch.from_numpy(slots).to(self.runner.device)
        return self._extend(step) if step.kind == "extend" else self._decode(step)

    def _prompt(self, i: int) -> np.ndarray:
        ids = self.prompt_ids.get(i)
        if ids is None:
            rng = np.random.default_rng(self.seed * 1_000_003 + i)
            ids = self.prompt_ids[i] = rng.integers(0, self.vocab, self.reqs.prompt[i])
        return ids

    def _extend(self, step: Step) -> int:
        chunks = step.chunks
        ids = [self._prompt(c.request)[c.prefix : c.prefix + c.tokens].tolist() for c in chunks]
        batch = extend_batch(self.runner.kv_pool, [self.row[c.request] for c in chunks],
                             [c.prefix for c in chunks], ids)
        piecewise, padded = self.graphs.piecewise, 0
        if piecewise is not None and piecewise.can_run(batch):
            captured = piecewise.captured_num_tokens
            padded = captured[bisect.bisect_left(captured, batch.num_tokens)]
            hidden = piecewise.replay(batch)
        else:
            hidden = self.runner.forward_eager(batch)
        ends = np.cumsum([c.tokens for c in chunks]) - 1
        done = [k for k, c in enumerate(chunks) if c.completes]
        if done:
            rows = torch.as_tensor(ends[done], device=hidden.device)
            tokens = self.runner.model.compute_logits(hidden[rows]).argmax(-1).tolist()
            for k, token in zip(done, tokens):
                i = chunks[k].request
                self.generated[i], self.last_token[i] = 1, token
                self.prompt_ids.pop(i, None)
        else:
            self.sync()
        return padded

    def _decode(self, step: Step) -> int:
        reqs = step.requests
        before = [self.reqs.prompt[i] + self.generated[i] - 1 for i in reqs]
        batch = decode_batch(self.runner.kv_pool, [self.row[i] for i in reqs], before,
                             [self.last_token[i] for i in reqs])
        decode, padded = self.graphs.decode, 0
        if decode is not None and decode.can_run(batch):
            captured = decode.captured_bs
            padded = captured[bisect.bisect_left(captured, batch.batch_size)]
            logits = decode.replay(batch)
        else:
            logits = self.runner.model.compute_logits(self.runner.forward_eager(batch))
        for i, token in zip(reqs, logits.argmax(-1).tolist()):
            self.generated[i] += 1
            self.last_token[i] = token
        return padded

    def _release(self, i: int) -> None:
        self.slots.give(self.row.pop(i), self.held.pop(i))
        self.generated.pop(i, None)
        self.last_token.pop(i, None)
