"""Step time, graph memory and capture time per size, estimated from a roofline.

A step splits into a dense part that depends only on how many rows the forward computes (the
padded size under a graph, the real size eagerly) and an attention part that depends on the
context and is the same whatever is captured. Schedules differ only in the dense part, which is
what the optimiser minimises; the attention part still counts in absolute step times.
Tables from a capture report are fitted in cgtool.planner.profile_fit; what a schedule costs
on a set of steps is cgtool.planner.scoring's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from cgtool.planner.kernel_terms import (
    GQA_EXTEND_FLOPS_EFFICIENCY,
    MLA_DECODE_READ_EFFICIENCY,
    MLA_EXTEND_FLOPS_EFFICIENCY,
    kernel_floor_ms,
    mla_decode_fixed_ms,
    mla_extend_copies_ms,
    mla_flat_plan_ms,
    moe_layers_ms,
)
from cgtool.planner.memory_terms import (
    GRAPH_NODE_BYTES,
    decode_graph_pool_bytes,
    extend_graph_pool_bytes,
)
from cgtool.planner.parallel import (
    allreduces_per_forward,
    collectives_per_forward,
    comm_ms,
    rank_shapes,
)
from cgtool.specs.config import ModelConfig
from cgtool.specs.gpus import GpuSpec
from cgtool.specs.hidden_states import HiddenMode, decode_hidden_buffer_bytes
from cgtool.units import BF16_BYTES, FP32_BYTES

# Achievable fractions of datasheet peaks for large bf16 GEMMs and streaming reads on
# Hopper-class parts (typical of published GEMM and memcpy benchmarks, not measured here).
_BANDWIDTH_EFFICIENCY = 0.85
_FLOPS_EFFICIENCY = 0.7
# Host cost of launching one kernel from eager PyTorch. 4 us puts an 8B model's eager decode
# at bs 1-32 20-30% above its graph replay, the range seed 001 gives for decode graphs.
_LAUNCH_MS = 4e-3
_GRAPH_LAUNCH_MS = 0.01  # one cudaGraphLaunch
# Each kernel of a replayed decode graph starts this much later in a process that captured any
# other graph after the set it replays, as a server's decode graphs sit beside its prefill
# graphs, than in a process that captured that set alone: the same kernels and kernel time,
# 0.31-0.45 us a kernel longer between them (three models on one H200, 2026-11-28,
# benchmarks/results/h200-2026-11-28-graph-gaps). `verify`'s steps, like a server's, run so.
# Plain kernels show no such gap; a graph shows it once it holds dependent launches, Triton's
# or cuBLAS's split-K products (there, calls 24-28), which every model's decode graph here does.
# Priced on the kernels outside the MoE layers: on every kernel it put qwen3-30b-a3b's recorded
# verify runs 2-5% under their decode predictions, so the MoE layers' fitted terms seem to hold
# part of it already (a choice made on those runs; why, not measured).
SERVER_GRAPH_GAP_MS = 0.37e-3
# Graph objects hold kernel parameters outside PyTorch's pool (measured: memory_terms).
_GRAPH_NODE_BYTES = GRAPH_NODE_BYTES
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
    # Static hidden-state output per captured decode request (0 at hidden-state mode NULL):
    # allocated outside the pool at the largest size, as the logits are.
    decode_hidden_row_bytes: float = 0.0
    # The engine's own graph-time buffers (cgtool.planner.engine_buffers), allocated outside
    # the pool at the largest decode size: bytes per request of that size, plus a constant.
    decode_static_row_bytes: float = 0.0
    decode_static_bytes: float = 0.0
    # False where the eager tables are the roofline's and not measured (a verify.json whose
    # steps all replayed): the planner then keeps its low and high eager assumptions.
    eager_measured: bool = True

    @property
    def max_bs(self) -> int:
        return len(self.decode_graph_ms) - 1

    @property
    def max_tokens(self) -> int:
        return len(self.extend_graph_ms) - 1

    def graph_bytes(
        self, decode_bs: list[int] | tuple[int, ...], tokens: list[int] | tuple[int, ...]
    ) -> int:
        """Both kinds capture into one pool, largest first, each kind on its own stream, whose
        freed blocks the other cannot take: the pool is the sum of the two largest sizes'
        needs (measured, cgtool.planner.memory_terms), and every graph adds its own objects
        on top; a hidden-state mode adds its static output, and the engine its static
        buffers, at the largest decode size."""
        pool = (
            (float(self.decode_pool_bytes[max(decode_bs)]) if decode_bs else 0.0)
            + (float(self.extend_pool_bytes[max(tokens)]) if tokens else 0.0)
        )
        max_bs = max(decode_bs, default=0)
        hidden = max_bs * (self.decode_hidden_row_bytes + self.decode_static_row_bytes)
        static = self.decode_static_bytes if decode_bs else 0.0
        return int(
            pool + len(decode_bs) * self.decode_graph_bytes + len(tokens) * self.extend_graph_bytes
            + hidden + static
        )

    def capture_s(
        self, decode_bs: list[int] | tuple[int, ...], tokens: list[int] | tuple[int, ...]
    ) -> float:
        return float(
            self.decode_capture_s[list(decode_bs)].sum() + self.extend_capture_s[list(tokens)].sum()
        )


def with_hidden_states(cost: CostModel, cfg: ModelConfig, mode: HiddenMode) -> CostModel:
    """The cost model of decode graphs captured at `mode`: the final hidden state is whole on
    every tensor-parallel rank, so its buffer is not sharded."""
    if mode is HiddenMode.NULL:
        return cost
    row = decode_hidden_buffer_bytes(mode, 1, cfg.hidden_size, BF16_BYTES)
    note = (
        f"hidden-state mode {mode.flag}: each captured decode request adds {row:,} B of static "
        "hidden-state output (allocated at the largest batch size), counted in the graph memory "
        "and --mem-fraction-static"
    )
    return replace(cost, decode_hidden_row_bytes=float(row), warnings=(*cost.warnings, note))


def kernels_per_forward(cfg: ModelConfig, tp_size: int = 1) -> int:
    # Per layer: norm, qkv, rope, kv store, attention, o_proj, add+norm, gate_up, act, down,
    # residual add (+ q/k norm); then embedding, final norm, lm_head, sampling; plus the
    # tensor-parallel all-reduces and the logits' all-gather.
    per_layer = 11 + int(cfg.qk_norm)
    if cfg.mla:  # q and latent projections apart, the latent's norm, two absorbing bmm's
        per_layer += 5
    moe = 0
    if cfg.moe:  # router GEMM, top-k softmax, expert sort, combine (+ shared SwiGLU and its add)
        moe = cfg.num_moe_layers * (4 + 4 * int(cfg.moe.num_shared_experts > 0))
    return cfg.num_layers * per_layer + moe + 4 + collectives_per_forward(cfg, tp_size)


def lone_decode_gap_ms(kinds: Sequence[str], kernels: float) -> float:
    """What a server's replay of a decode graph of `kernels` kernels adds to one timed by a
    capture of decode graphs alone (`kinds == ["decode"]`), which replays them before any other
    graph is captured: SERVER_GRAPH_GAP_MS a kernel. Zero for a capture of any other kinds, whose
    decode replays are timed after its prefill graphs, as a server's run."""
    return kernels * SERVER_GRAPH_GAP_MS if list(kinds) == ["decode"] else 0.0


def _kernels_outside_moe(cfg: ModelConfig, kernels: int) -> int:
    # kernels_per_forward counts a MoE layer as the dense MLP's three kernels plus four; the
    # MoE layers' own (kernel_terms.MOE_KERNELS_SMALL of them now) are in moe_layers_ms.
    return kernels - cfg.num_moe_layers * (3 + 4)


def weight_bytes_read(cfg: ModelConfig, rows: np.ndarray) -> np.ndarray:
    """Bytes of weights one forward over each of `rows` tokens streams (the config decides)."""
    return np.asarray(cfg.weight_bytes_read(np.asarray(rows, dtype=np.float64), BF16_BYTES), dtype=np.float64)


def _dense_ms(
    cfg: ModelConfig, gpu: GpuSpec, rows: np.ndarray, logit_rows: np.ndarray
) -> np.ndarray:
    head_params = cfg.vocab_size * cfg.hidden_size
    body_params = cfg.active_param_count() - head_params * (1 if cfg.tie_word_embeddings else 2)
    read_bytes = weight_bytes_read(cfg, rows)
    experts_ms = np.zeros_like(rows, dtype=np.float64)
    if cfg.moe is not None:
        # Routed experts at the efficiencies measured for cgtool's fused MoE (kernel_terms);
        # the rest of the model as a dense one.
        body_params -= cfg.num_moe_layers * cfg.moe.top_k * cfg.expert_params
        read_bytes = cfg.dense_param_count() * BF16_BYTES + rows * 0.0
        experts_ms = moe_layers_ms(cfg, gpu, rows)
    flops = 2.0 * (body_params * rows + head_params * logit_rows)
    read_ms = read_bytes / (gpu.bandwidth_bytes_s * _BANDWIDTH_EFFICIENCY) * 1e3 + experts_ms
    compute_ms = flops / (gpu.bf16_flops * _FLOPS_EFFICIENCY) * 1e3
    # A sum, not max(): at small batch the GEMMs neither stream weights at full bandwidth nor
    # keep the tensor cores busy, and measured decode steps grow with batch size long before
    # the ridge point, which a max() would flatten to zero padding cost.
    return read_ms + compute_ms


def decode_pool_bytes_at(cfg: ModelConfig, bs: np.ndarray, tp_size: int = 1) -> np.ndarray:
    # The fp32 logits go to the runner's static buffer, outside the pool (engine_buffers).
    return np.array([decode_graph_pool_bytes(cfg, int(b), tp_size) for b in bs], dtype=np.float64)


def extend_pool_bytes_at(cfg: ModelConfig, tokens: np.ndarray, tp_size: int = 1) -> np.ndarray:
    return extend_graph_pool_bytes(cfg, np.asarray(tokens, dtype=np.float64), tp_size) + cfg.vocab_size * FP32_BYTES


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
    # MoE and MLA models: the floor of every kernel outside the MoE layers (kernel_terms), and
    # MLA decode's fixed cost beyond its latent read (programs' start, merge), layer by layer,
    # and its step's plan once a forward.
    floor_ms = kernel_floor_ms(cfg, _kernels_outside_moe(cfg, kernels))
    mla_fixed_ms = (mla_decode_fixed_ms(shard.num_layers, shard.num_heads, bs, gpu.hopper)
                    + mla_flat_plan_ms(shard.num_heads, bs, gpu.hopper)) if cfg.mla else 0.0
    extend_copies_ms = mla_extend_copies_ms(shard.num_layers, tokens) if cfg.mla else 0.0
    decode_dense = _dense_ms(shard, gpu, bs, bs) + decode_comm + floor_ms + mla_fixed_ms
    extend_dense = _dense_ms(shard, gpu, tokens, np.ones_like(tokens)) + extend_comm + floor_ms + extend_copies_ms
    # Piecewise replay still launches the split ops eagerly between pieces: attention, and
    # under tensor parallelism the all-reduces (SGLang splits at inplace_all_reduce too).
    splits = cfg.num_layers + allreduces_per_forward(cfg, tp_size)
    piecewise_overhead_ms = splits * (_LAUNCH_MS + _GRAPH_LAUNCH_MS) + _GRAPH_LAUNCH_MS
    # Decode graphs only: prefill graphs' gap was not measured.
    server_gap_ms = _kernels_outside_moe(cfg, kernels) * SERVER_GRAPH_GAP_MS
    decode_eager = decode_dense + kernels * _LAUNCH_MS
    extend_eager = extend_dense + kernels * _LAUNCH_MS
    capture_per_size_s = kernels * _CAPTURE_S_PER_KERNEL
    # With MLA head_dim is the latent head's (rank + rope), whose values are the rank part:
    # counting both products over the full latent overstates them by rope / (rank + rope).
    attention_flops_per_pair = 4.0 * shard.num_layers * shard.num_heads * shard.head_dim
    # cgtool's MLA kernels, as measured (kernel_terms); other attention at the assumed rates.
    # Kept for GQA decode although llama-3.1-8b's decode captured at 1k-16k tokens a request read
    # KV at 4.54 TB/s (0.95 of the datasheet; H200, 2026-11-26,
    # benchmarks/results/h200-2026-11-26-replay-long/contexts): steps of mixed lengths in a real
    # loop ran slower than that, set by their longest request, a term this model lacks (docs/replay.md).
    kv_efficiency = MLA_DECODE_READ_EFFICIENCY if cfg.mla else _BANDWIDTH_EFFICIENCY
    attention_efficiency = MLA_EXTEND_FLOPS_EFFICIENCY if cfg.mla else GQA_EXTEND_FLOPS_EFFICIENCY
    return CostModel(
        source="roofline",
        decode_graph_ms=decode_dense + _GRAPH_LAUNCH_MS + server_gap_ms,
        decode_eager_ms=decode_eager,
        extend_graph_ms=extend_dense + piecewise_overhead_ms,
        extend_eager_ms=extend_eager,
        decode_pool_bytes=decode_pool_bytes_at(cfg, bs, tp_size),
        extend_pool_bytes=extend_pool_bytes_at(cfg, tokens, tp_size),
        decode_capture_s=_CAPTURE_PASSES * decode_eager / 1e3 + capture_per_size_s,
        extend_capture_s=_CAPTURE_PASSES * extend_eager / 1e3 + capture_per_size_s,
        decode_graph_bytes=float(kernels * _GRAPH_NODE_BYTES),
        extend_graph_bytes=float((kernels - splits) * _GRAPH_NODE_BYTES),
        kv_read_ms_per_token=shard.kv_bytes_per_token(BF16_BYTES) / (gpu.bandwidth_bytes_s * kv_efficiency) * 1e3,
        attention_ms_per_pair=attention_flops_per_pair / (gpu.bf16_flops * attention_efficiency) * 1e3,
        decode_comm_ms=decode_comm,
        extend_comm_ms=extend_comm,
    )
