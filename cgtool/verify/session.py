"""The GPU half of `cgtool verify`: the model and KV pool at the plan's fraction, the plan's
graphs captured and its worst eager steps rehearsed, the default's graphs captured into a
pool of their own, then the sampled steps replayed through both sets, repeat by repeat."""

from __future__ import annotations

import gc
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from cgtool.attention import redone_chunks
from cgtool.runners.pitfalls import is_out_of_memory
from cgtool.runners.pool import SizeStep
from cgtool.runtime.engine import ModelRunner, decode_batch, extend_batch
from cgtool.specs.config import ModelConfig
from cgtool.units import GIB
from cgtool.verify.result import Rehearsal
from cgtool.verify.steps import Step
from cgtool.verify.summary import SetMeasurement

Phase = Callable[[str], None]


@dataclass(frozen=True)
class GraphSet:
    name: str  # "plan" or "default"
    capture_bs: list[int]
    capture_num_tokens: list[int]


@dataclass(frozen=True)
class SessionOptions:
    model: str
    mem_fraction_static: float
    steps: list[Step]
    sets: tuple[GraphSet, GraphSet]  # the plan's first: its memory is rehearsed
    chunked_prefill_size: int
    max_running_requests: int
    context_len: int  # the server's: req_to_token is as wide as SGLang makes it
    repeats: int = 3
    warmup_steps: int = 32
    seed: int = 0
    dtype: torch.dtype = torch.bfloat16
    prefill_backend: str = "piecewise"  # cgtool.capture.prefill_backend


@dataclass
class SessionResult:
    kv_tokens: int = 0
    cfg: ModelConfig | None = None
    rehearsal: Rehearsal | None = None
    sets: list[SetMeasurement] = field(default_factory=list)


def run_session(opts: SessionOptions, phase: Phase) -> SessionResult:
    from cgtool.capture.session import resolve_model

    cfg, weights_dir = resolve_model(opts.model, random_weights=False)
    out = SessionResult(cfg=cfg)
    phase(f"load {cfg.name} at --mem-fraction-static {opts.mem_fraction_static}")
    try:
        runner = _build(cfg, weights_dir, opts, out)
    except torch.OutOfMemoryError as oom:  # the fraction leaves no room for what SGLang allocates next
        out.rehearsal = _out_of_memory(opts, "loading the model, KV pool and request table", str(oom))
        phase(f"out of memory loading: {out.rehearsal.remedy}")
        return out
    phase(f"KV pool {out.kv_tokens:,} tokens, {_free_gib():.2f} GiB free")
    live: list[Any] = []  # graphs must outlive the session: keep every runner
    for graph_set in opts.sets:
        is_plan = graph_set is opts.sets[0]
        if not is_plan:
            _release_cached_blocks()
        phase(f"capture {graph_set.name}: {len(graph_set.capture_bs)} decode, "
              f"{len(graph_set.capture_num_tokens)} piecewise sizes")
        measured, runners, oom = _capture_set(runner, graph_set, opts, strict=is_plan)
        live.append(runners)
        out.sets.append(measured)
        phase(f"captured {graph_set.name} in {measured.capture_s:.1f} s "
              f"(+{measured.compile_s:.1f} s compile), {measured.graph_bytes / GIB:.2f} GiB"
              + (f", out of memory at {', '.join(measured.failed_sizes)}" if oom else ""))
        if is_plan:
            out.rehearsal = oom or _rehearse(runner, opts)
            phase(f"rehearsal {out.rehearsal.status}: headroom "
                  f"{out.rehearsal.headroom_bytes / GIB:.2f} GiB")
            if out.rehearsal.status == "oom":
                return out
    phase(f"replay {len(opts.steps)} sampled steps x {opts.repeats} repeats through both sets")
    _replay(runner, opts, live, out.sets, phase)
    return out


def _release_cached_blocks() -> None:
    """Hand the rehearsal's cached activation blocks back to the device before the next set is
    captured. A graph's private pool cannot reuse blocks cached for eager steps, and graph
    instantiation takes device memory outside the allocator: with them still cached, the
    default's breakable prefill graphs ran out of memory beside the plan's (qwen3-30b-a3b and
    deepseek-v2-lite at their plans' fractions, H200, 2026-11-26), where a server running the
    default alone has them to spare."""
    gc.collect()
    torch.cuda.empty_cache()


def _build(cfg: ModelConfig, weights_dir: Any, opts: SessionOptions, out: SessionResult) -> ModelRunner:
    from cgtool.attention import make_backend
    from cgtool.runtime.kv import KVPool, free_after_weights, kv_budget_bytes, kv_tokens_for_budget

    width = _context_width(opts, cfg)
    model = load_model(cfg, weights_dir, opts, width)
    # An earlier session's cached blocks would otherwise shrink the pool (the 0.999 rehearsal then fitted).
    free, total = free_after_weights()
    # SGLang's order: the KV pool takes its share of what the weights left; req_to_token
    # comes out of the rest, as the server's does.
    kv_tokens = kv_tokens_for_budget(cfg, kv_budget_bytes(total, free, opts.mem_fraction_static), opts.dtype)
    out.kv_tokens = kv_tokens  # before the pool: an out-of-memory report names what was tried
    rows = max([opts.max_running_requests] + [s.size for s in opts.steps if s.kind == "decode"]
               + [bs for g in opts.sets for bs in g.capture_bs]) + 2
    pool = KVPool(cfg, kv_tokens, rows, width, opts.dtype, "cuda")
    spread_requests(pool, opts.seed)
    return ModelRunner(model, pool, make_backend("triton", cfg.num_heads, cfg.head_dim))


def load_model(
    cfg: ModelConfig, weights_dir: Any, opts: SessionOptions, width: int, device: str = "cuda"
) -> torch.nn.Module:
    from cgtool.model.loader import build_model
    from cgtool.model.moe import use_moe_backend

    model = build_model(cfg, device=device, dtype=opts.dtype, max_positions=width,
                        weights_dir=weights_dir, seed=opts.seed)
    # Models build with the dense MoE reference, which runs every expert on every token
    # (issue 33: qwen3-30b-a3b's verified decode step read 77.6 ms where capture's, on the
    # fused kernel, read 8 ms); the server runs a fused kernel, and so does capture.
    use_moe_backend(model, "triton")
    return model


def release_gpu() -> None:
    """Hand back what a finished session held: torch.compile's caches keep the model, and
    through it the pool and graphs, alive after the session's objects are gone."""
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()


def _context_width(opts: SessionOptions, cfg: ModelConfig) -> int:
    need = max([opts.chunked_prefill_size] + [s.context + (1 if s.kind == "decode" else s.size)
                                              for s in opts.steps])
    return min(max(opts.context_len, need + 1), cfg.max_context_len)


def spread_requests(pool: Any, seed: int) -> None:
    """Each request row on its own run of slots, the rows spread evenly over the whole pool,
    and every K/V buffer filled with random values (as a prefill would have left them)."""
    # The runs wrap around the pool: sampled steps hold more context in all than any one moment
    # of a server, and what matters for timing is that each request reads its own memory.
    rows, width = pool.req_to_token.shape
    usable = pool.num_slots - 1
    stride = max(usable // max(rows - 1, 1), 1)
    positions = torch.arange(width, device=pool.req_to_token.device)
    for row in range(1, rows):
        pool.req_to_token[row] = ((row - 1) * stride + positions) % usable + 1
    gen = torch.Generator(device=pool.req_to_token.device).manual_seed(seed)
    for buf in pool.k_buffers + pool.v_buffers:
        buf.normal_(generator=gen)  # stands in for prefilled K/V


def _capture_set(
    runner: ModelRunner, graph_set: GraphSet, opts: SessionOptions, strict: bool
) -> tuple[SetMeasurement, list[Any], Rehearsal | None]:
    """Into a pool of its own, so its graph memory is its own; piecewise first, as capture
    does. `strict` (the plan's set) stops at the first size that runs out of memory and
    returns that as a failed rehearsal: the plan's fraction must hold the plan's graphs."""
    from cgtool.capture.memory import read_memory
    from cgtool.capture.prefill_backend import prefill_runner
    from cgtool.runners.decode import DecodeGraphRunner
    from cgtool.runners.pool import get_global_graph_memory_pool, reset_global_graph_memory_pool

    reset_global_graph_memory_pool()
    pool = get_global_graph_memory_pool()
    before = read_memory(pool)
    failed: list[tuple[str, str]] = []  # (size, PyTorch's message)
    decode = piecewise = None
    compile_s = 0.0
    if graph_set.capture_num_tokens:
        piecewise = prefill_runner(opts.prefill_backend, runner, graph_set.capture_num_tokens)
        start = time.perf_counter()
        piecewise.warmup()
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - start
    start = time.perf_counter()
    if piecewise is not None:
        piecewise.capture(_each("piecewise", failed, strict))
    if graph_set.capture_bs and not (strict and failed):
        decode = DecodeGraphRunner(runner, graph_set.capture_bs)
        decode.capture(_each("decode", failed, strict))
    torch.cuda.synchronize()
    capture_s = time.perf_counter() - start
    after = read_memory(pool)
    graph_bytes = after.pool_bytes - before.pool_bytes + after.non_torch_bytes - before.non_torch_bytes
    measured = SetMeasurement(
        name=graph_set.name,
        capture_bs=decode.captured_bs if decode is not None else [],
        capture_num_tokens=list(piecewise.captured_num_tokens) if piecewise is not None else [],
        failed_sizes=[size for size, _ in failed], capture_s=capture_s, compile_s=compile_s,
        graph_bytes=graph_bytes, step_ms=[],
    )
    oom = _out_of_memory(opts, f"capture of {failed[0][0]}", failed[0][1]) if strict and failed else None
    return measured, [decode, piecewise], oom


def _each(kind: str, failed: list[tuple[str, str]], strict: bool) -> SizeStep:
    """The runner's step for one size: a size out of memory is noted in `failed`, and ends the
    kind's loop when `strict`."""
    def step(index: int, size: int, record: Callable[[], None]) -> bool:
        try:
            record()
        except RuntimeError as oom:
            if not is_out_of_memory(oom):
                raise
            failed.append((f"{kind} {size}", str(oom)))
            return not strict
        return True

    return step


def _rehearse(runner: ModelRunner, opts: SessionOptions) -> Rehearsal:
    """The largest eager extend (--chunked-prefill-size tokens) and the largest eager decode
    (--max-running-requests requests), with the plan's graphs held."""
    from cgtool.capture.memory import read_memory

    decode_context = max([s.context for s in opts.steps if s.kind == "decode"] or [1])
    torch.cuda.reset_peak_memory_stats()
    worst = (Step("extend", opts.chunked_prefill_size, 0, 1.0),
             Step("decode", opts.max_running_requests, decode_context, 1.0))
    for step in worst:
        try:
            logits = _as_engine_runs(runner, _batch(runner, step, opts.seed), None, None)()
            if step.kind == "decode":
                sample_as_engine(logits)
            del logits
            torch.cuda.synchronize()
        except torch.OutOfMemoryError as oom:
            unit = "tokens" if step.kind == "extend" else "requests"
            return _out_of_memory(opts, f"eager {step.kind} of {step.size} {unit}", str(oom))
    total = torch.cuda.mem_get_info()[1]
    peak = torch.cuda.max_memory_reserved() + read_memory(None).non_torch_bytes
    return Rehearsal("ok", opts.chunked_prefill_size, opts.max_running_requests, decode_context,
                     peak, total - peak, total)


def sample_as_engine(logits: torch.Tensor) -> torch.Tensor:
    """SGLang's sampler over the fp32 next-token logits [bs, vocab]: temperature in place,
    softmax into a new probability tensor (4 more bytes a logit at the peak), then the draw;
    at --max-running-requests its peak is the decode step's (issue 32)."""
    logits.div_(0.7)
    probs = torch.softmax(logits, dim=-1)
    return torch.argmax(probs, dim=-1)


def _out_of_memory(opts: SessionOptions, what: str, message: str) -> Rehearsal:
    free, total = torch.cuda.mem_get_info()
    from cgtool.capture.memory import oom_request_bytes

    remedy = _remedy(opts.mem_fraction_static, oom_request_bytes(message) - free, total)
    return Rehearsal("oom", opts.chunked_prefill_size, opts.max_running_requests, 0,
                     total - free, free, total, failed_step=what, remedy=remedy)


def _remedy(fraction: float, missing_bytes: int, total: int) -> str:
    # What the failed allocation lacked, plus 1 GiB of slack, taken from the KV share.
    lower = fraction - (max(missing_bytes, 0) + GIB) / total
    lower = max(0.0, int(lower * 100) / 100)
    return f"Lower --mem-fraction-static to {lower:.2f} or below (the plan says {fraction:.3f})."


def _batch(runner: ModelRunner, step: Step, seed: int) -> Any:
    """Decode: requests on rows 1..size, each `context` tokens in; extend: one request on
    row 1 adding `size` tokens after a cached prefix of `context`."""
    gen = torch.Generator().manual_seed(seed + step.size)
    ids = torch.randint(0, runner.model.cfg.vocab_size, (step.size,), generator=gen).tolist()
    if step.kind == "decode":
        return decode_batch(runner.kv_pool, range(1, step.size + 1), [step.context] * step.size, ids)
    return extend_batch(runner.kv_pool, [1], [step.context], [ids])


def _as_engine_runs(runner: ModelRunner, batch: Any, decode: Any, piecewise: Any) -> Callable[[], object]:
    """The step as the engine runs it: a graph when the set has one that fits, else eager;
    logits of each request's last token."""
    model = runner.model
    if batch.forward_mode.is_decode():
        if decode is not None and decode.can_run(batch):
            return lambda: decode.replay(batch)
        return lambda: model.compute_logits(runner.forward_eager(batch))
    if piecewise is not None and piecewise.can_run(batch):
        return lambda: model.compute_logits(piecewise.replay(batch)[-1:])
    return lambda: model.compute_logits(runner.forward_eager(batch)[-1:])


def _replay(runner: ModelRunner, opts: SessionOptions, live: list[Any],
            sets: list[SetMeasurement], phase: Phase) -> None:
    batches = [_batch(runner, step, opts.seed) for step in opts.steps]
    fns = [[_as_engine_runs(runner, b, d, p) for b in batches] for d, p in live]
    for set_fns in fns:
        for i in warmup_indices(opts.steps, opts.warmup_steps):
            set_fns[i]()
    counting = redone_chunks.counted(runner)
    for repeat in range(opts.repeats):
        # Alternate which set goes first, so a drift in clocks does not favour one of them.
        order = range(len(fns)) if repeat % 2 == 0 else reversed(range(len(fns)))
        for i in order:
            if counting:
                redone_chunks.reset(runner.device)
            sets[i].step_ms.append(_timed_steps(fns[i]))
            if counting:  # read after the steps' own sync
                sets[i].mla_chunks_redone = (sets[i].mla_chunks_redone or 0) + redone_chunks.read(runner.device)
        phase(f"repeat {repeat + 1}/{opts.repeats}: " + ", ".join(
            f"{m.name} {sum(m.step_ms[-1]) / len(m.step_ms[-1]):.3f} ms/step" for m in sets))


def warmup_indices(steps: list[Step], first: int) -> list[int]:
    """The steps run untimed before the repeats: the first `first`, then the first step of each
    kind and size not yet among them, and for extend whether it has a cached prefix. Kernels
    compile on their first launch of a shape (an extend split over a long prefix, a small
    step's query blocks), and a compile inside a timed repeat counted as step time: 0.3-0.7 s
    in a Mooncake verify's few steps of a size (H100, benchmarks/results/h100-2026-11-26-extend-split)."""
    chosen = list(range(min(first, len(steps))))
    seen = {_shape(steps[i]) for i in chosen}
    for i, step in enumerate(steps[first:], start=first):
        if _shape(step) not in seen:
            seen.add(_shape(step))
            chosen.append(i)
    return chosen


def _shape(step: Step) -> tuple[str, int, bool]:
    return step.kind, step.size, step.kind == "extend" and step.context > 0


def _timed_steps(fns: list[Callable[[], object]]) -> list[float]:
    # One event between consecutive steps: a step's time runs from the end of the previous
    # one, so host launch time shows wherever the GPU waits for it (eager steps).
    events = [torch.cuda.Event(enable_timing=True) for _ in range(len(fns) + 1)]
    torch.cuda.synchronize()
    events[0].record()
    for fn, end in zip(fns, events[1:]):
        fn()
        end.record()
    torch.cuda.synchronize()
    return [a.elapsed_time(b) for a, b in itertools.pairwise(events)]


def _free_gib() -> float:
    return torch.cuda.mem_get_info()[0] / GIB
