"""What the simulator predicts for a replay: the same slice, load, limits, KV pool and schedule.

`predict` is the one call into the planner's simulator. The simulator gives the decode
batch-size histogram, step times and the run's length, and each request's first token and
finish where it keeps them (`SimulationResult.requests`, the closed loop's); without them the
step-by-step policy (cgtool.replay.virtual) run on the same step costs gives those times. The
policy runs either way: `policy_agrees` records that it made the simulator's histogram.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from cgtool.planner.cost import CostModel, roofline_cost
from cgtool.planner.profile_fit import profile_cost
from cgtool.planner.scoring import served_ms
from cgtool.planner.simulator import StepCost, simulate
from cgtool.replay.policy import Requests, Scheduler
from cgtool.replay.result import Prediction, RequestLog
from cgtool.replay.summary import summarise_arrays
from cgtool.replay.virtual import run_virtual, step_cost_ms
from cgtool.specs.config import ModelConfig
from cgtool.specs.gpus import GpuSpec


@dataclass(frozen=True)
class PredictInputs:
    reqs: Requests
    chunked_prefill_size: int
    max_running_requests: int
    kv_tokens: int
    capture_bs: list[int]
    capture_num_tokens: list[int]


def cost_model(cfg: ModelConfig, gpu: GpuSpec, inputs: PredictInputs,
               profile: dict[str, Any] | None = None, profile_name: str = "report") -> CostModel:
    """The planner's tables, as `cgtool plan` builds them: the roofline, or a capture report's."""
    max_bs = max([inputs.max_running_requests, *inputs.capture_bs])
    max_tokens = max([inputs.chunked_prefill_size, *inputs.capture_num_tokens])
    if profile is None:
        return roofline_cost(cfg, gpu, max_bs=max_bs, max_tokens=max_tokens)
    return profile_cost(profile, cfg, gpu, max_bs=max_bs, max_tokens=max_tokens, source=profile_name)


def step_cost(cost: CostModel, inputs: PredictInputs) -> StepCost:
    """The schedule's step times: graph sizes padded to, eager beyond (SGLang pads)."""
    return StepCost(
        decode_ms=served_ms(cost.decode_graph_ms, cost.decode_eager_ms, tuple(inputs.capture_bs), True),
        extend_ms=served_ms(cost.extend_graph_ms, cost.extend_eager_ms,
                            tuple(inputs.capture_num_tokens), True),
        kv_read_ms_per_token=cost.kv_read_ms_per_token,
        attention_ms_per_pair=cost.attention_ms_per_pair,
    )


def predict(inputs: PredictInputs, cost: CostModel) -> Prediction:
    """The simulator's prediction of a replay (the adapter: see the module docstring)."""
    reqs, chunk, running = inputs.reqs, inputs.chunked_prefill_size, inputs.max_running_requests
    steps = step_cost(cost, inputs)
    arrival_s = np.array(reqs.arrival_ms) / 1e3
    sim = simulate(arrival_s, np.array(reqs.prompt), np.array(reqs.output), np.array(reqs.cached),
                   cost=steps, max_running_requests=running, chunked_prefill_size=chunk,
                   kv_capacity_tokens=inputs.kv_tokens)
    run = run_virtual(reqs, Scheduler(reqs, running, chunk, inputs.kv_tokens), step_cost_ms(steps))
    first, finish = _request_times(sim, run, len(reqs.prompt))
    log = RequestLog(list(reqs.arrival_ms), list(reqs.prompt), list(reqs.cached), list(reqs.output),
                     first, finish)
    kinds = [s.kind for s in run.steps]
    sizes = [s.size for s in run.steps]
    graph = [_on_graph(s.kind, s.size, inputs) for s in run.steps]
    summary = summarise_arrays(log, kinds, sizes, run.step_ms, float(np.mean(graph)) if graph else 0.0)
    # The simulator's own figures where it has them.
    decode_n, extend_n = int(sim.decode_counts.sum()), int(sim.extend_counts.sum())
    if decode_n:
        summary.decode_step_ms = float(sim.decode_time_s.sum() / decode_n * 1e3)
    if extend_n:
        summary.extend_step_ms = float(sim.extend_time_s.sum() / extend_n * 1e3)
    nonzero = np.nonzero(sim.decode_counts)[0]
    agrees = (nonzero.tolist() == summary.decode_sizes
              and sim.decode_counts[nonzero].tolist() == summary.decode_counts)
    summary.decode_sizes, summary.decode_counts = nonzero.tolist(), sim.decode_counts[nonzero].tolist()
    return Prediction(cost.source, summary, bool(agrees))


def _request_times(sim: Any, run: Any, n: int) -> tuple[list[float | None], list[float | None]]:
    """ms from the first arrival. The simulator's own (its closed loop keeps `requests`, from
    its first arrival, which is the slice's 0) where it has them, else the step policy's."""
    times = getattr(sim, "requests", None)
    if times is None or len(times.index) != n:
        return ([run.first_token_ms.get(i) for i in range(n)], [run.finish_ms.get(i) for i in range(n)])
    first: list[float | None] = [None] * n
    finish: list[float | None] = [None] * n
    for i, f, e in zip(times.index.tolist(), times.first_token_s.tolist(), times.finish_s.tolist()):
        first[i] = None if np.isnan(f) else f * 1e3
        finish[i] = None if np.isnan(e) else e * 1e3
    return first, finish


def _on_graph(kind: str, size: int, inputs: PredictInputs) -> bool:
    captured = inputs.capture_bs if kind == "decode" else inputs.capture_num_tokens
    return bool(captured) and size <= max(captured)
