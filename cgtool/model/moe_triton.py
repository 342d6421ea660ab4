"""Fused MoE experts in Triton: align token-expert pairs into blocks, then grouped GEMMs.

The torch reference (`moe.experts_ref`) runs every expert over every token. Here each
(token, top-k slot) pair is sorted by its expert into blocks of BLOCK_M rows, every expert's
rows padded up to a whole block (cgtool.model.moe_routing). One program of a grouped GEMM
multiplies one block by its expert's weights, so only the experts the batch routed to are
read. The first GEMM computes each pair's gate and up columns together and applies SiLU in
its epilogue; the second scales each row by its routing weight; a last kernel sums each
token's top-k rows. Shapes stay static for CUDA graphs: the number of blocks is bounded by its
worst case for the token count, every count stays on the device, and the blocks past the
real total return at once.

One token skips the alignment (DIRECT): each pair is a block of its own, and the down GEMM's
last program over a token's columns adds its top-k rows (runtime.tickets), so the layer is
three launches with the router's, where a replay pays a few microseconds for each.

From moe_grouped.GROUPED_MIN_MEAN_ROWS rows an expert (a few hundred tokens) the layer runs on
the grouped path instead, faster there (moe_grouped).

Tile shapes follow the mean rows an expert gets, as SGLang's per-shape configs do: at decode
sizes an expert's block is mostly padding and the GEMM streams weights, so narrow column tiles
and a deep K pipeline spread the weight read over every SM; at extend sizes wide tiles keep
the tensor cores fed. The table's figures are from issue 33's sweep (docs/moe-mla.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from cgtool.model.moe_grouped import grouped_mm_chosen, grouped_mm_experts, grouped_mm_usable
from cgtool.model.moe_routing import align_block_size, max_padded_pairs
from cgtool.runtime.dependent_launch import (
    dependent_launch,
    release_next_kernel,
    wait_for_previous_kernel,
)
from cgtool.runtime.tickets import tickets
from cgtool.runtime.triton_launch import CachedKernel, cdiv, next_power_of_2

__all__ = ["align_block_size", "direct_align", "experts_config", "fused_experts", "max_padded_pairs"]


@dataclass(frozen=True)
class GemmTiles:
    block_n: int  # output columns a program computes (gate and up columns each, when gated)
    block_k: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class ExpertsConfig:
    block_m: int  # rows of a block: the alignment of each expert's run
    up: GemmTiles  # the gate/up GEMM with SiLU
    down: GemmTiles  # the down GEMM


# (largest mean rows an expert gets, config): the fastest of issue 33's sweep (H200,
# 2026-11-26, benchmarks/results/h200-2026-11-26-moe-mla/call1/moe-mla.json, benchmarks/bench_moe_mla.py)
# at qwen3-30b-a3b's and deepseek-v2-lite's shapes. Decode (bs 1-64, under 8 rows an expert):
# 16-row blocks, 64 columns, K 128 deep over 4 stages. bs 256 (16-24 rows): 32-row blocks,
# 1.06-1.26x. 512 tokens (32-48 rows): 64-row blocks. 2k-8k tokens (128-768 rows): 128-row
# blocks, 128 gate/up and 256 down columns, 1.15-1.25x the 64-row config.
CONFIGS: tuple[tuple[float, ExpertsConfig], ...] = (
    (8, ExpertsConfig(16, GemmTiles(64, 128, 4, 4), GemmTiles(64, 128, 4, 4))),
    (24, ExpertsConfig(32, GemmTiles(64, 64, 4, 3), GemmTiles(64, 128, 4, 4))),
    (96, ExpertsConfig(64, GemmTiles(64, 64, 4, 4), GemmTiles(64, 64, 4, 4))),
    (float("inf"), ExpertsConfig(128, GemmTiles(128, 64, 8, 3), GemmTiles(256, 64, 8, 3))),
)


# block_m of the direct path: no alignment, one pair a block (`direct_align`), and the down
# GEMM's programs sum each token's rows. Up to DIRECT_TOKENS tokens: at 8 tokens the aligned
# path was as fast (qwen3-30b-a3b 3% slower, deepseek-v2-lite 4% faster; H200, 2026-11-26,
# benchmarks/results/h200-2026-11-26-moe-mla/call4). Tiles: the best of call4's and call5's
# sweeps at bs 1 for both presets (32 gate/up columns a program, 128 down columns).
DIRECT = 0
DIRECT_TOKENS = 1
DIRECT_CONFIG = ExpertsConfig(DIRECT, GemmTiles(32, 128, 4, 4), GemmTiles(128, 128, 4, 4))
MIN_BLOCK_M = 16  # tl.dot's fewest rows: the direct path's blocks are one row of 16


def experts_config(num_pairs: int, num_experts: int, num_tokens: int | None = None) -> ExpertsConfig:
    """Fixed by the shapes alone, so a captured grid stays valid for any routing."""
    if num_tokens is not None and num_tokens <= DIRECT_TOKENS:
        return DIRECT_CONFIG
    mean_rows = num_pairs / num_experts
    return next(config for bound, config in CONFIGS if mean_rows <= bound)


def block_m_for(num_pairs: int, num_experts: int) -> int:
    return experts_config(num_pairs, num_experts).block_m


@triton.jit
def _grouped_gemm_kernel(
    A, B, C, sorted_pair_ids, block_experts, num_padded, pair_weights, Out, Tickets,
    num_pairs, N, K, stride_am, stride_be, stride_bn, stride_cm,
    PAIRS_PER_ROW: tl.constexpr, MUL_WEIGHT: tl.constexpr, GATED: tl.constexpr,
    PRECISION: tl.constexpr, EVEN_K: tl.constexpr, DIRECT: tl.constexpr, TOP_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_previous_kernel(PDL)
    # C[pair, :] = A[pair // PAIRS_PER_ROW, :] @ B[expert].T for the pairs of one block; when
    # GATED, B holds N gate rows then N up rows and C gets silu(gate) * up. DIRECT: a block is
    # one pair and block_experts holds each pair's expert (the routing's ids, unaligned); the
    # down GEMM then also sums each token's TOP_K rows into Out (TOP_K > 0).
    pid_m = tl.program_id(0)
    if DIRECT:
        expert = tl.load(block_experts + pid_m).to(tl.int64)
        pairs = tl.where(tl.arange(0, BLOCK_M) == 0, pid_m, num_pairs)
    else:
        if pid_m * BLOCK_M >= tl.load(num_padded):
            return  # the grid covers the worst case; this block holds only padding
        expert = tl.load(block_experts + pid_m).to(tl.int64)
        pairs = tl.load(sorted_pair_ids + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    mask_m = pairs < num_pairs
    rows = (pairs // PAIRS_PER_ROW).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = A + rows[:, None] * stride_am + offs_k[None, :]  # [BLOCK_M, BLOCK_K]
    b_ptrs = B + expert * stride_be + offs_n[None, :] * stride_bn + offs_k[:, None]  # [BLOCK_K, BLOCK_N]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            mask_k = offs_k < BLOCK_K
        else:
            mask_k = offs_k < K - k0
        a = tl.load(a_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        if GATED:
            u = tl.load(b_ptrs + N * stride_bn, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
            acc_up = tl.dot(a, u, acc_up, input_precision=PRECISION)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    release_next_kernel(PDL)
    if GATED:
        # Rounded as the unfused path rounds: gate and up stored in C's dtype, F.silu's result
        # rounded before the product.
        gate = acc.to(C.dtype.element_ty).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(C.dtype.element_ty)
        acc = act.to(tl.float32) * acc_up.to(C.dtype.element_ty).to(tl.float32)
    if MUL_WEIGHT:
        acc = acc * tl.load(pair_weights + pairs, mask=mask_m, other=0.0)[:, None]
    c_ptrs = C + pairs.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])
    if TOP_K > 0:
        _sum_top_k_last(C, Out, Tickets, pid_m // TOP_K, offs_n, mask_n, N, stride_cm, TOP_K, BLOCK_N)


@triton.jit
def _sum_top_k_last(
    Y, Out, Tickets, token, offs_n, mask_n, N, stride_ym, TOP_K: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """The last of a token's TOP_K programs over these columns sums their rows into Out, in
    slot order from zero as `_combine_kernel` does (runtime.tickets)."""
    tl.debug_barrier()  # every thread's row stored before the ticket's release
    ticket = Tickets + token * tl.num_programs(1) + tl.program_id(1)
    if tl.atomic_add(ticket, 1, sem="acq_rel", scope="gpu") == TOP_K - 1:
        tl.atomic_xchg(ticket, 0, sem="relaxed", scope="gpu")
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for j in tl.static_range(TOP_K):
            acc += tl.load(Y + (token * TOP_K + j).to(tl.int64) * stride_ym + offs_n, mask=mask_n,
                           other=0.0, cache_modifier=".cg")
        tl.store(Out + token.to(tl.int64) * N + offs_n, acc.to(Out.dtype.element_ty), mask=mask_n)


@triton.jit
def _combine_kernel(Y, Out, hidden, TOP_K: tl.constexpr, BLOCK: tl.constexpr):
    # Out[t] = Σ_j Y[t * TOP_K + j] in fp32, rounded once, as the reference's einsum.
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < hidden
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        acc += tl.load(Y + (t * TOP_K + j) * hidden + offs, mask=mask, other=0.0)
    tl.store(Out + t * hidden + offs, acc.to(Out.dtype.element_ty), mask=mask)


_GROUPED_GEMM = CachedKernel(_grouped_gemm_kernel)
_COMBINE = CachedKernel(_combine_kernel)


def grouped_gemm(
    a: torch.Tensor, w: torch.Tensor, out: torch.Tensor, align: tuple[torch.Tensor, ...],
    pair_weights: torch.Tensor, pairs_per_row: int, block_m: int, tiles: GemmTiles,
    mul_weight: bool, gated: bool, summed: torch.Tensor | None = None, top_k: int = 0,
) -> None:
    """One grouped GEMM over `align` (alignment's three tensors, or `direct_align`'s); with
    `summed` (direct only), each token's top_k rows of `out` also summed into it."""
    sorted_pair_ids, block_experts, num_padded = align
    direct = sorted_pair_ids is block_experts
    assert a.stride(-1) == 1 and w.stride(-1) == 1 and out.stride(-1) == 1
    assert summed is None or direct, "the top-k sum in the GEMM takes one pair a block"
    n_out, k_in = w.shape[1] // (2 if gated else 1), w.shape[2]
    block_k = min(tiles.block_k, max(16, next_power_of_2(k_in)))
    grid = (block_experts.numel(), cdiv(n_out, tiles.block_n))
    counters = out if summed is None else tickets(out.device, summed.shape[0] * grid[1])
    # fp32 weights take exact fp32 products: TF32 would drift from the reference.
    precision = "ieee" if a.dtype == torch.float32 else "tf32"
    _GROUPED_GEMM.launch(
        grid, a, w, out, sorted_pair_ids, block_experts, num_padded, pair_weights,
        out if summed is None else summed, counters,
        out.shape[0], n_out, k_in, a.stride(0), w.stride(0), w.stride(1), out.stride(0),
        PAIRS_PER_ROW=pairs_per_row, MUL_WEIGHT=mul_weight, GATED=gated, PRECISION=precision,
        EVEN_K=k_in % block_k == 0, DIRECT=direct, TOP_K=top_k if summed is not None else 0,
        BLOCK_M=block_m, BLOCK_N=tiles.block_n, BLOCK_K=block_k,
        # one token's three launches (router, gate/up, down) follow each other closely
        **(dependent_launch(a.device) if direct else {"PDL": False}),
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )


def direct_align(ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The grouped GEMM's blocks without alignment: one pair a block, its expert from the
    routing's ids; the flat ids three times over, which `grouped_gemm` takes for this path.
    Each pair reads its expert's weights, so an expert that several pairs share is read once
    for each of them: worth it where a launch costs more than the repeats (one token)."""
    flat = ids.reshape(-1)
    flat = flat if flat.dtype == torch.int32 else flat.int()
    return flat, flat, flat


def combine_top_k(y: torch.Tensor, top_k: int, dtype: torch.dtype) -> torch.Tensor:
    """[n * top_k, hidden] fp32 rows -> [n, hidden] sums in `dtype`."""
    hidden = y.shape[1]
    out = torch.empty((y.shape[0] // top_k, hidden), dtype=dtype, device=y.device)
    block = min(1024, next_power_of_2(hidden))
    _COMBINE.launch((out.shape[0], cdiv(hidden, block)), y, out, hidden, TOP_K=top_k, BLOCK=block,
                    num_warps=4)
    return out


def _launch_fused_experts(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, weights: torch.Tensor,
    ids: torch.Tensor, config: ExpertsConfig | None = None,
) -> torch.Tensor:
    x = x if x.stride(-1) == 1 else x.contiguous()
    num_tokens, top_k = ids.shape
    num_experts, num_pairs, hidden = gate_up.shape[0], ids.numel(), x.shape[1]
    if config is None and grouped_mm_chosen(num_pairs, num_experts) and grouped_mm_usable(x, gate_up):
        return grouped_mm_experts(x, gate_up, down, weights, ids)
    config = config or experts_config(num_pairs, num_experts, num_tokens)
    direct = config.block_m == DIRECT
    block_m = MIN_BLOCK_M if direct else config.block_m
    align = direct_align(ids) if direct else align_block_size(ids, num_experts, block_m)
    pair_weights = weights.float().contiguous()  # [num_pairs] read flat, fp32 as routed
    act = torch.empty((num_pairs, gate_up.shape[1] // 2), dtype=x.dtype, device=x.device)  # [pairs, I]
    grouped_gemm(x, gate_up, act, align, pair_weights, top_k, block_m, config.up,
                 mul_weight=False, gated=True)
    # fp32 partial outputs, so the top-k sum rounds once, as the reference's einsum does.
    y = torch.empty((num_pairs, hidden), dtype=torch.float32, device=x.device)  # [pairs, hidden]
    if direct:
        out = torch.empty((num_tokens, hidden), dtype=x.dtype, device=x.device)
        grouped_gemm(act, down, y, align, pair_weights, 1, block_m, config.down,
                     mul_weight=True, gated=False, summed=out, top_k=top_k)
        return out
    grouped_gemm(act, down, y, align, pair_weights, 1, block_m, config.down,
                 mul_weight=True, gated=False)
    return combine_top_k(y, top_k, x.dtype)


def fused_experts(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, weights: torch.Tensor,
    ids: torch.Tensor, config: ExpertsConfig | None = None,
) -> torch.Tensor:
    """`moe.experts_ref` of the same arguments, reading only the routed experts' weights; at
    extend sizes on torch's grouped GEMM (moe_grouped). `config` forces the Triton path with
    those tiles (benchmarks)."""
    if torch.compiler.is_compiling():
        # One opaque node for dynamo; eager calls skip the custom op's dispatch cost.
        return torch.ops.cgtool.fused_experts(x, gate_up, down, weights, ids)
    return _launch_fused_experts(x, gate_up, down, weights, ids, config)


@torch.library.custom_op("cgtool::fused_experts", mutates_args=())
def _fused_experts_op(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, weights: torch.Tensor,
    ids: torch.Tensor,
) -> torch.Tensor:
    return _launch_fused_experts(x, gate_up, down, weights, ids)


@_fused_experts_op.register_fake
def _(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, weights: torch.Tensor,
    ids: torch.Tensor,
) -> torch.Tensor:
    return x.new_empty(x.shape)
