"""Step time, graph memory and capture time per size: a roofline estimate, or measured.

A step splits into a dense part that depends only on how many rows the forward computes (the
padded size under a graph, the real size eagerly) and an attention part that depends on the
context and is the same whatever is captured. Schedules differ only in the dense part, which is
what the optimiser minimises; the attention part still counts in absolute step times.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cgtool.config import ModelConfig
from cgtool.errors import InputError
from cgtool.gpus import GpuSpec
from cgtool.planner.memory import activation_bytes_per_token
from cgtool.planner.parallel import (
    allreduces_per_forward,
    collectives_per_forward,
    comm_ms,
    rank_shapes,
)
from cgtool.units import BF16_BYTES, FP32_BYTES

# Achievable fractions of datasheet peaks for large bf16 GEMMs and streaming reads on
# Hopper-class parts (typical of published GEMM and memcpy benchmarks, not measured here).
_BANDWIDTH_EFFICIENCY = 0.85
_FLOPS_EFFICIENCY = 0.7
_ATTENTION_FLOPS_EFFICIENCY = 0.5  # flash-style kernels reach less than dense GEMMs
# Host cost of launching one kernel from eager PyTorch. 4 us puts an 8B model's eager decode
# at bs 1-32 20-30% above its graph replay, the range seed 001 gives for decode graphs.
_LAUNCH_MS = 4e-3
_GRAPH_LAUNCH_MS = 0.01  # one cudaGraphLaunch
# Graph objects hold kernel parameters outside PyTorch's pool. 16 KiB a node puts one
# piecewise size of an 8B model near the 8 MB a size that SGLang reserves for it.
_GRAPH_NODE_BYTES = 16 << 10
# Capture runs two warm-ups and one recorded pass (seed 000), each paying Python dispatch per
# kernel; 150 us a kernel is an assumption that a capture report replaces.
_CAPTURE_PASSES = 3
_CAPTURE_S_PER_KERNEL = 150e-6


@dataclass(frozen=True, eq=False)
class CostModel:
    """Per-size tables (index = size) plus the schedule-independent attention costs."""

    source: str  # "roofline" or the capture report it was built from
    decode_graph_ms: np.ndarray  # [max_bs + 1] dense ms of a replay of a graph of this size
    decode_eager_ms: np.ndarray  # [max_bs + 1] dense ms of an eager step of this size
    extend_graph_ms: np.ndarray  # [max_tokens + 1]
    extend_eager_ms: np.ndarray  # [max_tokens + 1]
    decode_pool_bytes: np.ndarray  # [max_bs + 1] shared-pool bytes a graph of this size needs
    extend_pool_bytes: np.ndarray  # [max_tokens + 1]
    decode_capture_s: np.ndarray  # [max_bs + 1]
    extend_capture_s: np.ndarray  # [max_tokens + 1]
    decode_graph_bytes: float  # bytes outside the pool per decode graph
    extend_graph_bytes: float  # bytes outside the pool per piecewise size
    kv_read_ms_per_token: float  # decode attention: one context token of one request
    attention_ms_per_pair: float  # extend attention: one (query, key) token pair
    # [max_bs + 1], [max_tokens + 1]: the tensor-parallel collectives inside the dense tables
    # above (zero at tp 1); graphs and eager steps pay them alike.
    decode_comm_ms: np.ndarray
    extend_comm_ms: np.ndarray
    warnings: tuple[str, ...] = field(default=())

    @property
    def max_bs(self) -> int:
        return len(self.decode_graph_ms) - 1

    @property
    def max_tokens(self) -> int:
        return len(self.extend_graph_ms) - 1

    def graph_bytes(
        self, decode_bs: list[int] | tuple[int, ...], tokens: list[int] | tuple[int, ...]
    ) -> int:
        """Both kinds capture into one pool, largest first: the pool is the larger of the two
        largest sizes' needs, and every graph adds its own objects on top."""
        pool = max(
            float(self.decode_pool_bytes[max(decode_bs)]) if decode_bs else 0.0,
            float(self.extend_pool_bytes[max(tokens)]) if tokens else 0.0,
        )
        return int(
            pool + len(decode_bs) * self.decode_graph_bytes + len(tokens) * self.extend_graph_bytes
        )

    def capture_s(
        self, decode_bs: list[int] | tuple[int, ...], tokens: list[int] | tuple[int, ...]
    ) -> float:
        return float(
            self.decode_capture_s[list(decode_bs)].sum() + self.extend_capture_s[list(tokens)].sum()
        )


def kernels_per_forward(cfg: ModelConfig, tp_size: int = 1) -> int:
    # Per layer: norm, qkv, rope, kv store, attention, o_proj, add+norm, gate_up, act, down,
    # residual add (+ q/k norm); then embedding, final norm, lm_head, sampling; plus the
    # tensor-parallel all-reduces and the logits' all-gather.
    return cfg.num_layers * (11 + int(cfg.qk_norm)) + 4 + collectives_per_forward(cfg, tp_size)


def _dense_ms(
    cfg: ModelConfig, gpu: GpuSpec, rows: np.ndarray, logit_rows: np.ndarray
) -> np.ndarray:
    weight_bytes = cfg.weight_bytes(BF16_BYTES)
    head_params = cfg.vocab_size * cfg.hidden_size
    body_params = cfg.param_count() - head_params * (1 if cfg.tie_word_embeddings else 2)
    flops = 2.0 * (body_params * rows + head_params * logit_rows)
    read_ms = weight_bytes / (gpu.bandwidth_bytes_s * _BANDWIDTH_EFFICIENCY) * 1e3
    compute_ms = flops / (gpu.bf16_flops * _FLOPS_EFFICIENCY) * 1e3
    # A sum, not max(): at small batch the GEMMs neither stream weights at full bandwidth nor
    # keep the tensor cores busy, and measured decode steps grow with batch size long before
    # the ridge point, which a max() would flatten to zero padding cost.
    return read_ms + compute_ms


def _decode_pool_bytes(cfg: ModelConfig, bs: np.ndarray, tp_size: int = 1) -> np.ndarray:
    # Every decode row ends in fp32 logits over the vocabulary, the largest live tensor; under
    # tensor parallelism they are gathered whole on every rank.
    logits_row = cfg.vocab_size * FP32_BYTES + 2 * cfg.hidden_size * BF16_BYTES
    return bs * max(activation_bytes_per_token(cfg, tp_size), logits_row)


def _extend_pool_bytes(cfg: ModelConfig, tokens: np.ndarray, tp_size: int = 1) -> np.ndarray:
    return tokens * activation_bytes_per_token(cfg, tp_size) + cfg.vocab_size * FP32_BYTES


def roofline_cost(
    cfg: ModelConfig, gpu: GpuSpec, *, max_bs: int, max_tokens: int, tp_size: int = 1
) -> CostModel:
    """Estimate every table from model shapes and the GPU's datasheet peaks, for one rank of
    `tp_size` (its share of the weights and heads, plus the collectives between ranks)."""
    shard = rank_shapes(cfg, tp_size)
    kernels = kernels_per_forward(cfg, tp_size)
    bs = np.arange(max_bs + 1, dtype=np.float64)
    tokens = np.arange(max_tokens + 1, dtype=np.float64)
    decode_comm = comm_ms(cfg, gpu, tp_size, bs, bs)
    extend_comm = comm_ms(cfg, gpu, tp_size, tokens, np.ones_like(tokens))
    decode_dense = _dense_ms(shard, gpu, bs, bs) + decode_comm
    extend_dense = _dense_ms(shard, gpu, tokens, np.ones_like(tokens)) + extend_comm
    # Piecewise replay still launches the split ops eagerly between pieces: attention, and
    # under tensor parallelism the all-reduces (SGLang splits at inplace_all_reduce too).
    splits = cfg.num_layers + allreduces_per_forward(cfg, tp_size)
    piecewise_overhead_ms = splits * (_LAUNCH_MS + _GRAPH_LAUNCH_MS) + _GRAPH_LAUNCH_MS
    decode_eager = decode_dense + kernels * _LAUNCH_MS
    extend_eager = extend_dense + kernels * _LAUNCH_MS
    capture_per_size_s = kernels * _CAPTURE_S_PER_KERNEL
    attention_flops_per_pair = 4.0 * shard.num_layers * shard.num_heads * shard.head_dim
    return CostModel(
        source="roofline",
        decode_graph_ms=decode_dense + _GRAPH_LAUNCH_MS,
        decode_eager_ms=decode_eager,
        extend_graph_ms=extend_dense + piecewise_overhead_ms,
        extend_eager_ms=extend_eager,
        decode_pool_bytes=_decode_pool_bytes(cfg, bs, tp_size),
        extend_pool_bytes=_extend_pool_bytes(cfg, tokens, tp_size),
        decode_capture_s=_CAPTURE_PASSES * decode_eager / 1e3 + capture_per_size_s,
        extend_capture_s=_CAPTURE_PASSES * extend_eager / 1e3 + capture_per_size_s,
        decode_graph_bytes=float(kernels * _GRAPH_NODE_BYTES),
        extend_graph_bytes=float((kernels - splits) * _GRAPH_NODE_BYTES),
        kv_read_ms_per_token=shard.kv_bytes_per_token(BF16_BYTES)
        / (gpu.bandwidth_bytes_s * _BANDWIDTH_EFFICIENCY)
        * 1e3,
        attention_ms_per_pair=attention_flops_per_pair
        / (gpu.bf16_flops * _ATTENTION_FLOPS_EFFICIENCY)
        * 1e3,
        decode_comm_ms=decode_comm,
        extend_comm_ms=extend_comm,
    )


def _interpolate(sizes: np.ndarray, values: np.ndarray, length: int) -> np.ndarray:
    """Linear between measured sizes, flat below the first, beyond the last extended along
    the slope of the last two (eager cost keeps growing past the captured range)."""
    grid = np.arange(length, dtype=np.float64)
    table = np.interp(grid, sizes, values)
    if len(sizes) >= 2 and sizes[-1] > sizes[-2]:
        slope = max((values[-1] - values[-2]) / (sizes[-1] - sizes[-2]), 0.0)
        beyond = grid > sizes[-1]
        table[beyond] = values[-1] + slope * (grid[beyond] - sizes[-1])
    # A larger size computes more rows and cannot be faster; a dip is timing noise, and the
    # optimiser relies on tables that never fall.
    return np.maximum.accumulate(table)


def _rank0_ok(report: dict[str, Any]) -> list[dict[str, Any]]:
    # A tensor-parallel report holds a row per rank and size; its totals are rank 0's, and the
    # ranks step together (every all-reduce waits for all), so rank 0 stands for the server.
    rows = report.get("sizes", [])
    return [r for r in rows if r.get("status") == "ok" and r.get("rank", 0) == 0]


def _measured_rows(report: dict[str, Any], kind: str, source: str) -> dict[str, np.ndarray]:
    rows = [r for r in _rank0_ok(report) if r.get("kind") == kind]
    rows.sort(key=lambda r: r["size"])
    fields = ("size", "eager_ms", "replay_ms", "capture_s", "retained_bytes", "non_torch_bytes")
    try:
        return {f: np.array([float(r[f]) for r in rows]) for f in fields}
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(
            f"{source}: a '{kind}' size lacks a numeric {exc}",
            "Re-run `cgtool capture` to rewrite the report.",
        ) from None


def profile_cost(
    report: dict[str, Any],
    cfg: ModelConfig,
    gpu: GpuSpec,
    *,
    max_bs: int,
    max_tokens: int,
    source: str,
    tp_size: int = 1,
) -> CostModel:
    """Tables from a capture report's measured sizes, the roofline filling what it lacks."""
    base = roofline_cost(cfg, gpu, max_bs=max_bs, max_tokens=max_tokens, tp_size=tp_size)
    decode = _measured_rows(report, "decode", source)
    piecewise = _measured_rows(report, "piecewise", source)
    if not len(decode["size"]) and not len(piecewise["size"]):
        raise InputError(
            f"{source}: no size was captured successfully", "Plan without --profile, or re-capture."
        )
    context_len = float(report.get("settings", {}).get("context_len", 0) or 0)
    tables: dict[str, Any] = {}
    if len(decode["size"]):
        # Measured at context_len per request: take that attention read out of the dense part.
        attention = base.kv_read_ms_per_token * decode["size"] * context_len
        for name, column in (("decode_graph_ms", "replay_ms"), ("decode_eager_ms", "eager_ms")):
            dense = np.maximum(decode[column] - attention, 0.1 * decode[column])
            tables[name] = _interpolate(decode["size"], dense, max_bs + 1)
        tables["decode_capture_s"] = _interpolate(decode["size"], decode["capture_s"], max_bs + 1)
        tables["decode_graph_bytes"] = _per_graph_bytes(decode, base.decode_graph_bytes)
    if len(piecewise["size"]):
        pairs = piecewise["size"] * (piecewise["size"] + 1) / 2  # one request, causal
        attention = base.attention_ms_per_pair * pairs
        for name, column in (("extend_graph_ms", "replay_ms"), ("extend_eager_ms", "eager_ms")):
            dense = np.maximum(piecewise[column] - attention, 0.1 * piecewise[column])
            tables[name] = _interpolate(piecewise["size"], dense, max_tokens + 1)
        tables["extend_capture_s"] = _interpolate(
            piecewise["size"], piecewise["capture_s"], max_tokens + 1
        )
        tables["extend_graph_bytes"] = _per_graph_bytes(piecewise, base.extend_graph_bytes)
    scale = _pool_scale(report, cfg, decode["size"], piecewise["size"])
    tables["decode_pool_bytes"] = base.decode_pool_bytes * scale
    tables["extend_pool_bytes"] = base.extend_pool_bytes * scale
    notes = _mismatches(report, cfg, gpu, source) + _tp_mismatch(report, tp_size, source)
    return _with(base, source=source, warnings=notes, **tables)


def _report_tp_size(report: dict[str, Any]) -> int:
    # Reports written before tensor-parallel capture carry no tp_size: they ran on one GPU.
    return int(report.get("settings", {}).get("tp_size", 1) or 1)


def _tp_mismatch(report: dict[str, Any], tp_size: int, source: str) -> tuple[str, ...]:
    measured = _report_tp_size(report)
    if measured == tp_size:
        return ()
    return (
        (f"{source} was measured at --tp {measured}, the plan is for --tp {tp_size}: its step "
        "times and graph memory are of the other split"),
    )


def _per_graph_bytes(rows: dict[str, np.ndarray], fallback: float) -> float:
    # The largest size was captured first and grew the pool; the others show what one more
    # graph costs.
    if len(rows["size"]) < 2:
        return fallback
    extra = rows["retained_bytes"][:-1] + rows["non_torch_bytes"][:-1]
    return float(np.median(extra))


def _pool_scale(
    report: dict[str, Any], cfg: ModelConfig, decode_sizes: np.ndarray, tokens: np.ndarray
) -> float:
    measured = float(report.get("totals", {}).get("graph_pool_bytes", 0) or 0)
    tp = _report_tp_size(report)
    predicted = max(
        float(_decode_pool_bytes(cfg, decode_sizes[-1:], tp).sum()),
        float(_extend_pool_bytes(cfg, tokens[-1:], tp).sum()) if len(tokens) else 0.0,
    )
    return measured / predicted if measured > 0 and predicted > 0 else 1.0


def _mismatches(
    report: dict[str, Any], cfg: ModelConfig, gpu: GpuSpec, source: str
) -> tuple[str, ...]:
    notes = []
    measured_gpu = str(report.get("environment", {}).get("gpu_name", ""))
    if measured_gpu and not any(
        n.lower() in measured_gpu.lower() for n in gpu.nvml_names + (gpu.name,)
    ):
        notes.append(f"{source} was measured on {measured_gpu}, the plan is for {gpu.name}")
    report_hash = report.get("model", {}).get("config_hash")
    if report_hash and report_hash != cfg.config_hash():
        notes.append(
            f"{source} was measured on another model ({report.get('model', {}).get('name')})"
        )
    if report.get("status") == "incomplete":
        notes.append(f"{source} is incomplete: sizes it lacks are interpolated or estimated")
    return tuple(notes)


def _with(base: CostModel, **changes: Any) -> CostModel:
    values = {name: getattr(base, name) for name in CostModel.__dataclass_fields__}
    return CostModel(**(values | changes))


def predicted_graph_bytes(
    report: dict[str, Any], cfg: ModelConfig, gpu: GpuSpec
) -> tuple[int, int]:
    """(roofline prediction, measurement) of graph memory for the sizes a report captured."""
    ok = _rank0_ok(report)
    decode = [int(r["size"]) for r in ok if r.get("kind") == "decode"]
    tokens = [int(r["size"]) for r in ok if r.get("kind") == "piecewise"]
    model = roofline_cost(
        cfg,
        gpu,
        max_bs=max(decode, default=1),
        max_tokens=max(tokens, default=1),
        tp_size=_report_tp_size(report),
    )
    totals = report.get("totals", {})
    measured = int(totals.get("graph_pool_bytes", 0)) + int(totals.get("non_torch_bytes", 0))
    return model.graph_bytes(decode, tokens), measured


# ---- what a capture schedule costs on a set of steps


def padded_sizes(
    sizes: np.ndarray, captured: list[int] | tuple[int, ...], pads: bool = True
) -> np.ndarray:
    """The graph size each step replays, 0 where it runs eagerly."""
    if not len(captured):
        return np.zeros(len(sizes), dtype=np.int64)
    graphs = np.array(sorted(captured), dtype=np.int64)
    index = np.searchsorted(graphs, sizes, side="left")
    padded = np.where(index < len(graphs), graphs[np.minimum(index, len(graphs) - 1)], 0)
    if not pads:
        padded = np.where(padded == sizes, padded, 0)
    return padded


def dense_ms(
    sizes: np.ndarray,
    counts: np.ndarray,
    graph_ms: np.ndarray,
    eager_ms: np.ndarray,
    captured: list[int] | tuple[int, ...],
    pads: bool = True,
) -> float:
    """Summed dense ms of the observed steps under a capture list."""
    padded = padded_sizes(sizes, captured, pads)
    per_step = np.where(padded > 0, graph_ms[padded], eager_ms[sizes])
    return float((counts * per_step).sum())


@dataclass(frozen=True, eq=False)
class Histogram:
    """Steps of one kind: how often each size ran, for how long, and its attention time
    (context reads for decode, query-key work for extend), which no schedule changes."""

    sizes: np.ndarray  # [k] ascending
    counts: np.ndarray  # [k]
    time_s: np.ndarray  # [k] time spent at each size in the simulation
    attention_ms: np.ndarray  # [k] summed over those steps

    def to_dict(self) -> dict[str, list]:
        return {
            "sizes": self.sizes.tolist(),
            "counts": self.counts.tolist(),
            "time_s": self.time_s.tolist(),
        }


@dataclass(frozen=True, slots=True)
class ScheduleScore:
    schedule: str  # "plan" or "default"
    expected_step_ms: float
    decode_coverage: float  # share of decode steps that replay a graph
    extend_coverage: float
    padding_waste: float  # share of rows (decode) and tokens (extend) computed only as padding
    num_graphs: int
    graph_bytes: int
    capture_s: float
    kv_tokens: int
    comm_ms: float = 0.0  # tensor-parallel collectives inside expected_step_ms


def _kind_totals(
    hist: Histogram, graph_ms: np.ndarray, eager_ms: np.ndarray, captured, pads
) -> tuple[float, float, float, float]:
    """(dense + attention ms, steps on a graph, padding units, computed units)."""
    padded = padded_sizes(hist.sizes, captured, pads)
    on_graph = padded > 0
    total_ms = dense_ms(hist.sizes, hist.counts, graph_ms, eager_ms, captured, pads) + float(
        hist.attention_ms.sum()
    )
    computed = np.where(on_graph, padded, hist.sizes)
    padding = float((hist.counts * (computed - hist.sizes)).sum())
    return (
        total_ms,
        float(hist.counts[on_graph].sum()),
        padding,
        float((hist.counts * computed).sum()),
    )


def score_schedule(
    name: str,
    decode: Histogram,
    extend: Histogram,
    cost,
    decode_bs,
    tokens,
    *,
    pads: bool = True,
    kv_tokens: int = 0,
) -> ScheduleScore:
    """Expected step time, coverage and cost of a capture schedule on the given steps."""
    d_ms, d_graph, d_pad, d_rows = _kind_totals(
        decode, cost.decode_graph_ms, cost.decode_eager_ms, decode_bs, pads
    )
    e_ms, e_graph, e_pad, e_rows = _kind_totals(
        extend, cost.extend_graph_ms, cost.extend_eager_ms, tokens, pads
    )
    d_steps, e_steps = float(decode.counts.sum()), float(extend.counts.sum())
    # A padded replay all-reduces its padding rows too.
    d_comm, e_comm = cost.decode_comm_ms, cost.extend_comm_ms
    comm = dense_ms(decode.sizes, decode.counts, d_comm, d_comm, decode_bs, pads) + dense_ms(
        extend.sizes, extend.counts, e_comm, e_comm, tokens, pads
    )
    return ScheduleScore(
        schedule=name,
        expected_step_ms=(d_ms + e_ms) / max(d_steps + e_steps, 1.0),
        decode_coverage=d_graph / d_steps if d_steps else 0.0,
        extend_coverage=e_graph / e_steps if e_steps else 0.0,
        padding_waste=(d_pad + e_pad) / max(d_rows + e_rows, 1.0),
        num_graphs=len(decode_bs) + len(tokens),
        graph_bytes=cost.graph_bytes(list(decode_bs), list(tokens)),
        capture_s=cost.capture_s(list(decode_bs), list(tokens)),
        kv_tokens=kv_tokens,
        comm_ms=comm / max(d_steps + e_steps, 1.0),
    )


def served_ms(
    graph_ms: np.ndarray, eager_ms: np.ndarray, captured: tuple[int, ...], pads: bool
) -> np.ndarray:
    """Dense ms of every size under a capture list (index = size)."""
    sizes = np.arange(len(graph_ms))
    padded = padded_sizes(sizes, captured, pads)
    return np.where(padded > 0, graph_ms[np.minimum(padded, len(graph_ms) - 1)], eager_ms)
