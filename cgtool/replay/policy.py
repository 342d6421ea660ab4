"""The scheduling policy of cgtool.planner.simulator, one step at a time, for a real loop.

The simulator jumps over runs of identical decode steps; a real loop cannot, so this is the
same policy taken step by step: arrivals queue first come, first served; an extend step runs
whenever the split prompt needs finishing or the queue's head fits (fewer than
`max_running` running, its prompt and whole output free in the KV pool), taking the split
prompt first, then whole queued prompts, then splitting the next one to fill
`chunked_prefill_size` tokens; otherwise every running request decodes one token. KV is
reserved at admission for prompt plus output (`footprint`), freed at finish. Nothing here
knows of clocks, tensors or graphs: the caller asks for a step at a time of its own and
reports it done.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field

from cgtool.specs.kinds import StepKind


@dataclass(frozen=True, slots=True)
class Chunk:
    """Part of one request's prompt computed in an extend step."""

    request: int
    prefix: int  # tokens already in the KV pool (cached prefix plus earlier chunks)
    tokens: int  # new tokens computed now
    completes: bool  # the prompt is done: this step yields the request's first token


@dataclass(frozen=True, slots=True)
class Step:
    kind: StepKind
    size: int  # tokens (extend) or requests (decode)
    chunks: tuple[Chunk, ...] = ()  # extend
    requests: tuple[int, ...] = ()  # decode, in admission order
    context: int = 0  # decode: context tokens the decoding requests hold before the step
    pairs: float = 0.0  # extend: causal (query, key) pairs of its chunks
    admitted: tuple[int, ...] = ()  # requests admitted by this step


@dataclass(slots=True)
class Requests:
    """Per request, in arrival order: the simulator's `_prepare` accounting."""

    arrival_ms: list[float]
    prompt: list[int]
    cached: list[int]  # at most prompt - 1: the last prompt token is always computed
    output: list[int]

    @property
    def new(self) -> list[int]:
        return [p - c for p, c in zip(self.prompt, self.cached)]

    def decode_steps(self, i: int) -> int:
        return max(self.output[i] - 1, 0)

    def footprint(self, i: int) -> int:
        return self.prompt[i] + self.decode_steps(i) + 1


def requests_from(arrival_s: Sequence[float], input_len: Sequence[int], output_len: Sequence[int],
                  cached_len: Sequence[int] | None = None) -> Requests:
    cached = cached_len if cached_len is not None else [0] * len(input_len)
    return Requests(
        [float(a) * 1e3 for a in arrival_s],
        [int(p) for p in input_len],
        [min(max(int(c), 0), int(p) - 1) for c, p in zip(cached, input_len)],
        [int(o) for o in output_len],
    )


@dataclass
class Scheduler:
    reqs: Requests
    max_running: int
    chunk: int
    kv_capacity: int
    head: int = 0  # the queue is [head, arrived)
    arrived: int = 0
    kv_used: int = 0
    decoding: dict[int, int] = field(default_factory=dict)  # request -> decode steps left
    context: int = 0  # tokens the decoding requests hold
    split: int = -1
    split_done: int = 0

    def __post_init__(self) -> None:
        self._new = self.reqs.new
        self._footprint = [self.reqs.footprint(i) for i in range(len(self.reqs.prompt))]

    @property
    def done(self) -> bool:
        return self.head >= len(self.reqs.prompt) and not self.decoding and self.split < 0

    def next_arrival_ms(self) -> float | None:
        return self.reqs.arrival_ms[self.arrived] if self.arrived < len(self.reqs.arrival_ms) else None

    def _fits(self, i: int, running: int) -> bool:
        return running < self.max_running and self.kv_used + self._footprint[i] <= self.kv_capacity

    def next_step(self, clock_ms: float) -> Step | None:
        """The step to run at `clock_ms`, its effects applied; None when nothing can run
        before the next arrival."""
        self.arrived = bisect_right(self.reqs.arrival_ms, clock_ms, self.arrived)
        if self.split >= 0 or (self.head < self.arrived and self._fits(self.head, len(self.decoding))):
            return self._extend()
        if self.decoding:
            return self._decode()
        return None

    def _extend(self) -> Step:
        chunks: list[Chunk] = []
        admitted: list[int] = []
        running = len(self.decoding) + (self.split >= 0)
        tokens = 0
        if self.split >= 0:
            i = self.split
            take = min(self._new[i] - self.split_done, self.chunk)
            chunks.append(Chunk(i, self.reqs.cached[i] + self.split_done, take,
                                self.split_done + take == self._new[i]))
            self.split_done += take
            tokens = take
            if self.split_done == self._new[i]:
                self.split = -1
        budget = self.chunk - tokens
        if self.split < 0:
            # Whole prompts while they fit the budget, the running limit and the pool.
            while (budget > 0 and self.head < self.arrived and self._new[self.head] <= budget
                   and self._fits(self.head, running)):
                i = self.head
                chunks.append(Chunk(i, self.reqs.cached[i], self._new[i], True))
                self.kv_used += self._footprint[i]
                admitted.append(i)
                running += 1
                tokens += self._new[i]
                budget -= self._new[i]
                self.head += 1
            if budget > 0 and self.head < self.arrived and self._fits(self.head, running):
                i = self.head  # longer than what is left of the budget: split it
                chunks.append(Chunk(i, self.reqs.cached[i], budget, False))
                self.kv_used += self._footprint[i]
                admitted.append(i)
                self.split, self.split_done = i, budget
                tokens += budget
                self.head += 1
        for c in chunks:
            if c.completes:
                self._start_decoding(c.request)
        pairs = sum(c.tokens * c.prefix + c.tokens * (c.tokens + 1) / 2.0 for c in chunks)
        return Step("extend", tokens, chunks=tuple(chunks), pairs=pairs, admitted=tuple(admitted))

    def _start_decoding(self, i: int) -> None:
        steps = self.reqs.decode_steps(i)
        if steps:
            self.decoding[i] = steps
            self.context += self._footprint[i] - steps  # prompt and first output
        else:
            self.kv_used -= self._footprint[i]

    def _decode(self) -> Step:
        requests = tuple(self.decoding)
        step = Step("decode", len(requests), requests=requests, context=self.context)
        self.context += len(requests)
        for i in requests:
            left = self.decoding[i] - 1
            if left:
                self.decoding[i] = left
            else:
                del self.decoding[i]
                self.kv_used -= self._footprint[i]
                self.context -= self._footprint[i]
        return step

    def finished_by(self, step: Step) -> list[int]:
        """Requests whose last token the step produced (call after `next_step` returned it)."""
        if step.kind == "decode":
            return [i for i in step.requests if i not in self.decoding]
        return [c.request for c in step.chunks if c.completes and self.reqs.decode_steps(c.request) == 0]
