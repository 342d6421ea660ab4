"""`cgtool verify` end to end: inputs checked and steps sampled on the CPU, then the GPU
session, then verify.json's figures."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cgtool.capture.prefill_backend import choose_prefill_backend
from cgtool.documents.plan_document import Plan
from cgtool.documents.provenance import collect_provenance
from cgtool.documents.results import load_plan
from cgtool.errors import InputError
from cgtool.planner.cost import CostModel
from cgtool.verify.population import (
    plan_cost,
    population_from_histograms,
    population_from_trace,
)
from cgtool.verify.profile import first_capture_note
from cgtool.verify.proof import DEFAULT_HEADROOM_BYTES
from cgtool.verify.result import Rehearsal, VerifyResult, VerifySettings
from cgtool.verify.session import GraphSet, Phase, SessionOptions
from cgtool.verify.steps import Step, StepPopulation, sample_steps
from cgtool.verify.summary import SetMeasurement, ratio_interval, summarise_set


@dataclass(frozen=True)
class VerifyInputs:
    plan: Plan
    plan_path: Path
    trace: Path | None
    population: StepPopulation
    steps: list[Step]
    cost: CostModel
    mem_fraction_static: float
    fraction_source: str  # "plan" or "flag"
    repeats: int
    seed: int
    warnings: list[str]
    headroom_bytes: int = DEFAULT_HEADROOM_BYTES  # what the proven fraction must leave free
    prefill_backend: str = "piecewise"  # "breakable" or "piecewise": the runner of the prefill graphs


def prepare(
    plan_path: Path,
    *,
    trace: Path | None = None,
    trace_format: str = "cgtool",
    num_steps: int = 2000,
    repeats: int = 3,
    seed: int = 0,
    mem_fraction_static: float | None = None,
    headroom_bytes: int = DEFAULT_HEADROOM_BYTES,
    prefill_backend: str | None = None,
) -> VerifyInputs:
    """Everything that needs no GPU: every bad input is found here, before the GPU is asked for."""
    if num_steps < 1:
        raise InputError(f"--steps {num_steps} must be at least 1", "Try --steps 2000.")
    if repeats < 2:
        raise InputError(f"--repeats {repeats} gives no interval", "Use --repeats 2 or more (default 3).")
    if mem_fraction_static is not None and not 0.0 < mem_fraction_static < 1.0:
        raise InputError(f"--mem-fraction-static {mem_fraction_static} must be between 0 and 1",
                         "Leave it out to use the plan's.")
    if headroom_bytes < 0:
        raise InputError(f"--headroom {headroom_bytes} bytes is negative", "Try --headroom 1.5GiB.")
    plan = load_plan(plan_path)
    warnings: list[str] = []
    if trace is not None:
        if not Path(trace).is_file():
            raise InputError(f"--trace {trace}: no such file", "Pass the trace the plan was made from.")
        population, notes = population_from_trace(plan, trace, trace_format)
        warnings += notes
    else:
        population = population_from_histograms(plan)
        warnings.append("no --trace: steps come from plan.json's histograms, decode context "
                        f"{population.decode.context[:1].tolist() or [0]} tokens assumed, extend "
                        "prefixes 0; pass --trace for the simulated contexts")
    steps = sample_steps(population, num_steps, seed)
    if not steps:
        raise InputError(f"{plan_path}: the plan's histograms hold no step", "Re-plan from a trace with requests.")
    sizes = [s.size for s in steps]
    inputs, decode, piecewise = plan.inputs, plan.decode, plan.piecewise
    max_bs = max([inputs.max_running_requests or 1] + sizes + decode.capture_bs
                 + decode.default_capture_bs)
    max_tokens = max([inputs.chunked_prefill_size or 1] + sizes + piecewise.capture_num_tokens
                     + piecewise.default_capture_num_tokens)
    fraction = mem_fraction_static or plan.memory.mem_fraction_static
    return VerifyInputs(
        plan=plan, plan_path=Path(plan_path), trace=trace, population=population, steps=steps,
        cost=plan_cost(plan, max_bs, max_tokens), mem_fraction_static=fraction,
        fraction_source="flag" if mem_fraction_static else "plan", repeats=repeats, seed=seed,
        warnings=warnings, headroom_bytes=headroom_bytes,
        prefill_backend=choose_prefill_backend(prefill_backend, inputs.engine, inputs.engine_version),
    )


def session_options(inputs: VerifyInputs) -> SessionOptions:
    plan = inputs.plan
    decode, piecewise, asked = plan.decode, plan.piecewise, plan.inputs
    sets = (
        GraphSet("plan", decode.capture_bs, piecewise.capture_num_tokens),
        GraphSet("default", decode.default_capture_bs, piecewise.default_capture_num_tokens),
    )
    extend_sizes = [s.size for s in inputs.steps if s.kind == "extend"]
    # Plans before 1.1 name no limits: the largest extend sampled and the largest graph.
    return SessionOptions(
        model=asked.model,
        mem_fraction_static=inputs.mem_fraction_static,
        steps=inputs.steps,
        sets=sets,
        chunked_prefill_size=asked.chunked_prefill_size or max(extend_sizes, default=1),
        max_running_requests=asked.max_running_requests or decode.max_bs,
        context_len=asked.context_len or 0,
        repeats=inputs.repeats,
        seed=inputs.seed,
        prefill_backend=inputs.prefill_backend,
    )


def run_verify(inputs: VerifyInputs, phase: Phase) -> VerifyResult:
    """The GPU session and its summary. Needs CUDA (checked by the caller)."""
    import torch

    from cgtool.capture.session import environment, model_info
    from cgtool.verify.session import release_gpu, run_session

    opts = session_options(inputs)
    try:
        session = run_session(opts, phase)
    finally:
        release_gpu()
    assert session.cfg is not None
    rehearsal = session.rehearsal or Rehearsal("skipped", 0, 0, 0, 0, 0, 0)
    result = VerifyResult(
        environment=environment(),
        model=model_info(session.cfg, torch.bfloat16),
        settings=_settings(inputs, opts, session.kv_tokens),
        rehearsal=rehearsal,
        warnings=list(inputs.warnings),
        provenance=collect_provenance(),
    )
    _prove(inputs, opts, result, session.kv_tokens, phase)
    if rehearsal.status == "oom":
        result.status = "oom"
        result.reason = f"{rehearsal.failed_step} ran out of memory at --mem-fraction-static {inputs.mem_fraction_static:g}"
        return result
    summarise_sets(result, inputs, session.sets)
    return result


def summarise_sets(result: VerifyResult, inputs: VerifyInputs, measured_sets: list[SetMeasurement]) -> None:
    """The sets' summaries against the plan's predictions, their ratio, and the warnings they
    raise, into `result`."""
    result.sets = [summarise_set(m, inputs.steps, inputs.cost, inputs.plan) for m in measured_sets]
    result.ratio = ratio_interval(result.sets[0].repeat_step_ms, result.sets[1].repeat_step_ms)
    for measured in measured_sets:
        if measured.failed_sizes:
            result.warnings.append(f"{measured.name}: out of memory capturing "
                                   f"{', '.join(measured.failed_sizes)}; those steps ran eagerly")
    note = first_capture_note(result)
    if note is not None:
        result.warnings.append(note)
    redone = {s.name: s.mla_chunks_redone for s in result.sets if s.mla_chunks_redone}
    if redone:
        counts = ", ".join(f"{name} {count:,}" for name, count in redone.items())
        result.warnings.append(
            f"MLA decode did chunks twice over the timed steps ({counts}): their scores left the "
            f"range of stage 1's fixed maximum, and each cost about a second pass over its keys, "
            f"which the step times include; CGTOOL_MLA_FIXED_MAX=0 times these weights without it")


def _prove(inputs: VerifyInputs, opts: SessionOptions, result: VerifyResult, kv_tokens: int,
           phase: Phase) -> None:
    """The fraction that leaves the headroom, proven by one more build and rehearsal; the
    recommendation is the highest fraction a rehearsal passed with that headroom."""
    from cgtool.verify.proof import (
        kv_tokens_at,
        recommended_fraction,
        run_proof,
        tightened_fraction,
    )
    from cgtool.verify.session import release_gpu

    fraction, first = inputs.mem_fraction_static, result.rehearsal
    tried = [(fraction, first)]
    target = tightened_fraction(fraction, first, inputs.headroom_bytes)
    if target is not None and 0.0 < target < 1.0 and target != fraction:
        try:
            result.proof = run_proof(opts, target, inputs.headroom_bytes, phase)
        finally:
            release_gpu()
        tried.append((target, result.proof.rehearsal))
    result.recommended_mem_fraction_static, note = recommended_fraction(tried, inputs.headroom_bytes)
    if note:
        result.warnings.append(note)
    token_bytes = _kv_bytes_per_token(inputs)
    default = inputs.plan.memory.default_mem_fraction_static
    if kv_tokens and first.total_bytes and token_bytes:
        result.default_kv_tokens = kv_tokens_at(kv_tokens, fraction, default, first.total_bytes, token_bytes)
        if result.recommended_mem_fraction_static is not None:
            result.recommended_kv_tokens = kv_tokens_at(
                kv_tokens, fraction, result.recommended_mem_fraction_static, first.total_bytes, token_bytes)


def _kv_bytes_per_token(inputs: VerifyInputs) -> int:
    from cgtool.specs.config import load_model_config
    from cgtool.units import BF16_BYTES

    return int(load_model_config(inputs.plan.inputs.model).kv_bytes_per_token(BF16_BYTES))


def _settings(inputs: VerifyInputs, opts: SessionOptions, kv_tokens: int) -> VerifySettings:
    return VerifySettings(
        plan=str(inputs.plan_path),
        trace=None if inputs.trace is None else str(inputs.trace),
        step_source=inputs.population.source,  # type: ignore[arg-type]
        mem_fraction_static=inputs.mem_fraction_static,
        fraction_source=inputs.fraction_source,  # type: ignore[arg-type]
        steps=len(inputs.steps),
        repeats=inputs.repeats,
        seed=inputs.seed,
        kv_tokens=kv_tokens,
        chunked_prefill_size=opts.chunked_prefill_size,
        max_running_requests=opts.max_running_requests,
        simulated_steps=inputs.population.total,
        prefill_backend=opts.prefill_backend,
    )
