"""The device half of a replay: model, KV pool and graphs built, the loop run, the result
assembled with the simulator's prediction (roofline, and the profile's when given)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from cgtool.replay.loop import Graphs, ReplayLoop
from cgtool.replay.policy import Requests, Scheduler
from cgtool.replay.predict import PredictInputs, cost_model, predict
from cgtool.replay.result import ReplayResult, ReplaySettings
from cgtool.replay.run import Phase, ReplayInputs, context_width, with_limit
from cgtool.replay.summary import compare, summarise
from cgtool.runtime.engine import ModelRunner
from cgtool.specs.config import load_model_config
from cgtool.specs.gpus import GpuSpec


@dataclass
class Bench:
    """A model and KV pool, reusable by several replays (and graph sets) in one process."""

    runner: ModelRunner
    kv_tokens: int  # usable slots (slot 0 is the padding dummy)
    mem_fraction_static: float | None


def build_bench(inputs: ReplayInputs, width: int | None = None, rows: int | None = None) -> Bench:
    from cgtool.attention import make_backend
    from cgtool.model.loader import build_model
    from cgtool.runtime.kv import KVPool, free_after_weights, kv_budget_bytes, kv_tokens_for_budget

    cfg, device = inputs.cfg, inputs.device
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    width = width or context_width(inputs.reqs, cfg)
    model = build_model(cfg, device=device, dtype=dtype, max_positions=width, seed=inputs.seed)
    fraction: float | None = None
    if inputs.max_total_tokens is not None:
        slots = inputs.max_total_tokens + 1
    elif device == "cuda":
        free, total = free_after_weights()
        fraction = inputs.mem_fraction_static
        slots = kv_tokens_for_budget(cfg, kv_budget_bytes(total, free, fraction), dtype)
    else:  # the CPU has no fraction to honour: room for the whole slice at once
        slots = sum(inputs.reqs.footprint(i) for i in range(len(inputs.reqs.prompt))) + 1
    pool = KVPool(cfg, slots, (rows or inputs.max_running_requests) + 2, width, dtype, device)
    runner = ModelRunner(model, pool, make_backend(inputs.attention_backend, cfg.num_heads, cfg.head_dim))
    return Bench(runner, slots - 1, fraction)


def capture_graphs(bench: Bench, capture_bs: list[int], capture_num_tokens: list[int], phase: Phase,
                   prefill_backend: str = "piecewise") -> Graphs:
    """GPU only: prefill first (torch.compile pieces compile), then decode, into a fresh
    global pool."""
    from cgtool.capture.prefill_backend import prefill_runner
    from cgtool.runners.compile_cache import default_cache_dir
    from cgtool.runners.decode import DecodeGraphRunner
    from cgtool.runners.pool import reset_global_graph_memory_pool

    reset_global_graph_memory_pool()
    graphs = Graphs()
    start = time.perf_counter()
    if capture_num_tokens:
        # The compile cache spares a second set (or a capture before it) dynamo's trace.
        options = {"compile_cache_dir": default_cache_dir()} if prefill_backend == "piecewise" else {}
        graphs.piecewise = prefill_runner(prefill_backend, bench.runner, capture_num_tokens, **options)
        graphs.piecewise.capture()
    if capture_bs:
        graphs.decode = DecodeGraphRunner(bench.runner, capture_bs)
        graphs.decode.capture()
    torch.cuda.synchronize()
    phase(f"captured {len(capture_bs)} decode and {len(capture_num_tokens)} {prefill_backend} prefill sizes "
          f"in {time.perf_counter() - start:.1f} s")
    return graphs


def replay_once(inputs: ReplayInputs, bench: Bench, graphs: Graphs, phase: Phase,
                stop: Callable[[], bool] = lambda: False) -> ReplayResult:
    """One replay of the slice on a built bench; the result carries its predictions."""
    inputs, dropped = with_limit(inputs, bench.kv_tokens)
    reqs = inputs.reqs
    scheduler = Scheduler(reqs, inputs.max_running_requests, inputs.chunked_prefill_size, bench.kv_tokens)
    loop = ReplayLoop(bench.runner, graphs, reqs, scheduler, inputs.seed)
    phase(f"replay {len(reqs.prompt)} requests over {reqs.arrival_ms[-1] / 1e3:.1f} s of arrivals "
          f"({inputs.schedule}, load {inputs.load:g}, KV {bench.kv_tokens:,} tokens)")
    state = loop.run(stop)
    captured_bs = graphs.decode.captured_bs if graphs.decode is not None else []
    captured_tokens = list(graphs.piecewise.captured_num_tokens) if graphs.piecewise is not None else []
    result = ReplayResult(
        environment=_environment(inputs.device), model=_model_info(inputs),
        settings=ReplaySettings(
            trace=inputs.trace, schedule=inputs.schedule, plan=inputs.plan, requests=len(reqs.prompt),
            load=inputs.load, chunked_prefill_size=inputs.chunked_prefill_size,
            max_running_requests=inputs.max_running_requests, kv_tokens=bench.kv_tokens,
            mem_fraction_static=bench.mem_fraction_static, capture_bs=captured_bs,
            capture_num_tokens=captured_tokens, attention_backend=inputs.attention_backend,
            device=inputs.device, seed=inputs.seed, dropped_requests=dropped, profile=inputs.profile_name,
            prefill_backend=inputs.prefill_backend,
        ),
        requests=state.requests, steps=state.steps,
    )
    if state.stopped:
        result.status, result.reason = "incomplete", "stopped by a signal before every request finished"
    if dropped:
        result.warnings.append(f"{dropped} requests longer than the KV pool or the context were dropped, "
                               "as the simulator drops them")
    if len(state.steps):
        attach_predictions(result, inputs)
    return result


def attach_predictions(result: ReplayResult, inputs: ReplayInputs) -> None:
    predict_replay(result, inputs.gpu, inputs.profile, inputs.profile_name)


def predict_replay(result: ReplayResult, gpu: GpuSpec, profile: dict[str, Any] | None = None,
                   profile_name: str | None = None) -> None:
    """The simulator on the requests the replay ran, with the sizes it really captured (none
    on the CPU, where every step runs eagerly); from replay.json alone, so a run can be
    predicted again later from another capture report."""
    s, r = result.settings, result.requests
    reqs = Requests(list(r.arrival_ms), list(r.input_len), list(r.cached_len), list(r.output_len))
    pin = PredictInputs(reqs, s.chunked_prefill_size, s.max_running_requests, s.kv_tokens,
                        s.capture_bs, s.capture_num_tokens)
    cfg = load_model_config(result.model.name)
    result.measured = summarise(result.requests, result.steps)
    result.predictions, result.metrics = [], []
    s.gpu, s.profile = gpu.name, profile_name if profile is not None else None
    sources: list[tuple[dict[str, Any] | None, str]] = [(None, "roofline")]
    if profile is not None:
        sources.insert(0, (profile, profile_name or "report"))
    for table, name in sources:
        cost = cost_model(cfg, gpu, pin, table, name)
        prediction = predict(pin, cost)
        prediction.note = "; ".join(cost.warnings)
        result.predictions.append(prediction)
        result.metrics += compare(result.measured, prediction)
    result.warnings = [w for w in result.warnings if not w.startswith(_EARLY)]
    if result.status == "incomplete":
        result.warnings.append(_EARLY + ": predictions cover every request of the slice, "
                               "the measurement only those that ran")


_EARLY = "the run stopped early"


def _environment(device: str) -> Any:
    from cgtool.documents.results import Environment

    if device == "cuda":
        from cgtool.capture.session import environment

        return environment()
    import socket

    from cgtool import __version__

    return Environment("cpu", 0, "", "", torch.__version__, __version__, socket.gethostname())


def _model_info(inputs: ReplayInputs) -> Any:
    from cgtool.capture.session import model_info

    return model_info(inputs.cfg, torch.bfloat16 if inputs.device == "cuda" else torch.float32)
