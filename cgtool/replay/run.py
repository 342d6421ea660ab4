"""`cgtool replay` end to end: inputs checked on the host, the model and graphs built, the loop
run, the simulator's prediction beside it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from cgtool.capture.prefill_backend import choose_prefill_backend
from cgtool.errors import InputError
from cgtool.replay.policy import Requests, requests_from
from cgtool.specs.config import ModelConfig, load_model_config
from cgtool.specs.gpus import GpuSpec

Phase = Callable[[str], None]


@dataclass(frozen=True)
class ReplayInputs:
    trace: str
    reqs: Requests  # the slice, arrivals from 0 and divided by the load
    load: float
    cfg: ModelConfig
    model: str
    gpu: GpuSpec  # what the prediction's roofline is for
    schedule: str  # "plan" or "default"
    plan: str | None
    capture_bs: list[int]
    capture_num_tokens: list[int]
    chunked_prefill_size: int
    max_running_requests: int
    mem_fraction_static: float
    max_total_tokens: int | None
    profile: dict[str, Any] | None
    profile_name: str | None
    device: str
    attention_backend: str
    seed: int
    prefill_backend: str = "piecewise"  # "breakable" or "piecewise": the runner of the prefill graphs


def prepare(trace: Path, *, plan: Path | None = None, default: bool = False, requests: int = 300,
            load: float = 1.0, model: str | None = None, gpu: GpuSpec,
            chunked_prefill_size: int | None = None, max_running_requests: int | None = None,
            mem_fraction_static: float | None = None, max_total_tokens: int | None = None,
            profile: list[Path] | None = None, device: str = "cuda", attention_backend: str | None = None,
            seed: int = 0, prefill_backend: str | None = None) -> ReplayInputs:
    """Every bad input found here, before any model is built."""
    if requests < 1:
        raise InputError(f"--requests {requests} must be at least 1", "Try --requests 300.")
    if not load > 0:
        raise InputError(f"--load {load} must be above 0", "Try --load 1.")
    if plan is None and not default:
        raise InputError("no schedule to replay", "Pass --plan plan.json, or --default for the engine's own.")
    if max_total_tokens is not None and max_total_tokens < 2:
        raise InputError(f"--max-total-tokens {max_total_tokens} holds no request", "Leave it out or raise it.")
    if mem_fraction_static is not None and not 0.0 < mem_fraction_static < 1.0:
        raise InputError(f"--mem-fraction-static {mem_fraction_static} must be between 0 and 1", "Try 0.85.")
    reqs = _slice(trace, requests, load)
    loaded_plan = _load_plan(plan) if plan is not None else None
    name = model or (loaded_plan.inputs.model if loaded_plan else "llama-3.1-8b")
    cfg = load_model_config(name)
    if loaded_plan is not None:
        chunk = chunked_prefill_size or loaded_plan.inputs.chunked_prefill_size or 8192
        running = max_running_requests or loaded_plan.inputs.max_running_requests or loaded_plan.decode.max_bs
        fraction = mem_fraction_static or loaded_plan.memory.mem_fraction_static
        sizes = ((loaded_plan.decode.default_capture_bs, loaded_plan.piecewise.default_capture_num_tokens)
                 if default else (loaded_plan.decode.capture_bs, loaded_plan.piecewise.capture_num_tokens))
    else:
        chunk, running, fraction, sizes = _engine_defaults(cfg, gpu, chunked_prefill_size,
                                                           max_running_requests, mem_fraction_static)
    report, report_name = _profile(profile)
    # The plan's release, else the engine default's (server_for plans SGLang's latest).
    release = (loaded_plan.inputs.engine, loaded_plan.inputs.engine_version) if loaded_plan else ("sglang", None)
    return ReplayInputs(
        trace=str(trace), reqs=reqs, load=load, cfg=cfg, model=name, gpu=gpu,
        schedule="default" if default else "plan", plan=None if plan is None else str(plan),
        capture_bs=sorted(sizes[0]), capture_num_tokens=sorted(sizes[1]),
        chunked_prefill_size=chunk, max_running_requests=running, mem_fraction_static=fraction,
        max_total_tokens=max_total_tokens, profile=report, profile_name=report_name, device=device,
        attention_backend=attention_backend or ("triton" if device == "cuda" else "torch"), seed=seed,
        prefill_backend=choose_prefill_backend(prefill_backend, *release),
    )


def _slice(path: Path, n: int, load: float) -> Requests:
    from cgtool.traces.trace import RequestTrace, read_trace

    if not Path(path).is_file():
        raise InputError(f"--trace {path}: no such file", "Pass a cgtool JSON Lines trace (cgtool trace convert).")
    trace = read_trace(path)
    if not isinstance(trace, RequestTrace):
        raise InputError(f"--trace {path}: holds batches, not requests",
                         "Replay needs request lines (arrival, input_len, output_len).")
    if not len(trace):
        raise InputError(f"--trace {path}: holds no request", "Pass a trace with requests.")
    arrival = trace.arrival_s[:n]
    return requests_from((arrival - arrival[0]) / load, trace.input_len[:n], trace.output_len[:n],
                         trace.cached_len[:n])


def _load_plan(path: Path) -> Any:
    from cgtool.documents.results import load_plan

    if not Path(path).is_file():
        raise InputError(f"--plan {path}: no such file", "Pass the plan.json `cgtool plan --out DIR` wrote.")
    return load_plan(Path(path))


def _engine_defaults(cfg: ModelConfig, gpu: GpuSpec, chunk: int | None, running: int | None,
                     fraction: float | None) -> tuple[int, int, float, tuple[list[int], list[int]]]:
    from cgtool.planner.request import PlanRequest
    from cgtool.planner.server import server_for

    server = server_for(PlanRequest(cfg, gpu, chunked_prefill_size=chunk, max_running_requests=running))
    sizes = (list(server.default.decode_bs), list(server.default.piecewise_tokens))
    return server.chunk, server.max_running, fraction or server.default_fraction, sizes


def _profile(paths: list[Path] | None) -> tuple[dict[str, Any] | None, str | None]:
    if not paths:
        return None, None
    from cgtool.replay.profile import load_profiles

    for path in paths:
        if not Path(path).is_file():
            raise InputError(f"--profile {path}: no such file", "Pass a capture report.json of the same model and GPU.")
    return load_profiles([Path(p) for p in paths]), ", ".join(str(p) for p in paths)


def resolve_gpu(name: str, device: str) -> GpuSpec:
    """--gpu: a table name, or auto: the visible CUDA device (by torch's name, so NVML is not
    needed), else cgtool's usual detection."""
    from cgtool.specs.gpus import gpu_spec, match_nvml_name

    if name.lower() == "auto" and device == "cuda":
        import torch

        spec = match_nvml_name(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else None
        if spec is not None:
            return spec
    return gpu_spec(name)


def kept(reqs: Requests, limit_tokens: int) -> tuple[Requests, int]:
    """The requests the simulator keeps: whole footprint within the pool and the context."""
    keep = [i for i in range(len(reqs.prompt)) if reqs.footprint(i) <= limit_tokens]
    if len(keep) == len(reqs.prompt):
        return reqs, 0
    pick = lambda values: [values[i] for i in keep]
    return Requests(pick(reqs.arrival_ms), pick(reqs.prompt), pick(reqs.cached), pick(reqs.output)), \
        len(reqs.prompt) - len(keep)


def context_width(reqs: Requests, cfg: ModelConfig) -> int:
    longest = max((reqs.footprint(i) for i in range(len(reqs.prompt))), default=1)
    return min(longest + 1, cfg.max_context_len)


def with_limit(inputs: ReplayInputs, kv_tokens: int) -> tuple[ReplayInputs, int]:
    reqs, dropped = kept(inputs.reqs, min(kv_tokens, inputs.cfg.max_context_len))
    if not reqs.prompt:
        raise InputError(f"{inputs.trace}: no request of the slice fits the KV pool ({kv_tokens} tokens) "
                         f"or {inputs.cfg.name}'s context", "Raise --mem-fraction-static or pick another slice.")
    return replace(inputs, reqs=reqs), dropped


def arrival_span_s(reqs: Requests) -> float:
    return float(np.max(reqs.arrival_ms) / 1e3) if reqs.arrival_ms else 0.0
