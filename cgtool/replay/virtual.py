"""The replay policy on a simulated clock: each step takes what a cost function says.

With the simulator's StepCost this makes the simulator's batches one step at a time and adds
what the simulator does not keep, each request's first token and finish; the tests hold the
two to the same histograms. With the step times a real replay measured, it re-makes the
real replay's decisions (the loop's check in CI).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from cgtool.planner.simulator import StepCost
from cgtool.replay.policy import Requests, Scheduler, Step

StepMs = Callable[[Step], float]


@dataclass
class VirtualRun:
    steps: list[Step] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    start_ms: list[float] = field(default_factory=list)
    first_token_ms: dict[int, float] = field(default_factory=dict)
    finish_ms: dict[int, float] = field(default_factory=dict)
    clock_ms: float = 0.0


def step_cost_ms(cost: StepCost) -> StepMs:
    """The simulator's price of a step: dense table plus attention (context read or pairs)."""
    decode, extend = cost.decode_ms.tolist(), cost.extend_ms.tolist()

    def price(step: Step) -> float:
        if step.kind == "decode":
            return decode[step.size] + cost.kv_read_ms_per_token * step.context
        return extend[step.size] + step.pairs * cost.attention_ms_per_pair

    return price


def run_virtual(reqs: Requests, scheduler: Scheduler, step_ms: StepMs,
                max_steps: int | None = None) -> VirtualRun:
    run = VirtualRun()
    clock = 0.0
    while not scheduler.done and (max_steps is None or len(run.steps) < max_steps):
        step = scheduler.next_step(clock)
        if step is None:
            nxt = scheduler.next_arrival_ms()
            if nxt is None:
                break
            clock = max(clock, nxt)
            continue
        elapsed = step_ms(step)
        run.steps.append(step)
        run.step_ms.append(elapsed)
        run.start_ms.append(clock)
        clock += elapsed
        record_times(scheduler, step, clock, run.first_token_ms, run.finish_ms)
    run.clock_ms = clock
    return run


def record_times(scheduler: Scheduler, step: Step, end_ms: float,
                 first_token: dict[int, float], finish: dict[int, float]) -> None:
    if step.kind == "extend":
        for c in step.chunks:
            if c.completes:
                first_token[c.request] = end_ms
    for i in scheduler.finished_by(step):
        finish[i] = end_ms
