"""A persistent Triton grouped GEMM over experts' contiguous rows, its tiles loaded by TMA.

torch's grouped GEMM (CUTLASS) ran cgtool's extend-sized MoE GEMMs at 450-600 TFLOP/s, where
one 8192^3 `torch.mm` reaches ~790 (issue 33). Its tiles are fixed (128x256x64 past 128 mean
rows) and each group's operands get tensor maps of their own. Here every expert's rows lie in
one sorted `[pairs, K]` tensor and every expert's weights in one `[E * N, K]` view, so two
tensor maps serve all groups: a tile of expert e starts at its first row and at row `e * N` of
the weights. A tile's rows past its expert's end belong to the next expert (or lie past the
tensor, which TMA fills with zeros); they are computed and never stored.

The gated form computes the gate and the up halves of one column tile and writes
silu(gate) * up * the pair's routing weight, rounded as `moe_grouped.silu_mul_weight` rounds
the grouped GEMM's bf16 output: the [pairs, 2 * I] intermediate never reaches memory. The
gathering form reads A's rows from the tokens through the sort's order (no [pairs, K] copy).
With tails, an expert's last rows, when at most half a tile, take a half-height tile of their
own after the rest. The joint form loads a whole tile's gate and up weights' rows in one box of
the [E, 2, I, K] view and multiplies them in one product twice as wide. The persistent programs
take tiles block-major (a row block's columns one after another) or expert-major (one column's
row blocks side by side, so tiles that run at once read the same tile of the weights).
"""

from __future__ import annotations

from functools import cache

import torch
import triton
import triton.language as tl

from cgtool.runtime.gpu_class import is_h100
from cgtool.runtime.triton_launch import cdiv, next_power_of_2

try:  # Triton 3.4 on: host-side tensor maps passed to the kernel by value
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton: the grouped path keeps torch's GEMM
    TensorDescriptor = None


@triton.jit
def _expert_blocks(Ends, num_experts, E_POW2: tl.constexpr, BM: tl.constexpr, TAIL: tl.constexpr):
    # Each expert's rows [starts, ends) cut into BM-row blocks, numbered expert after expert;
    # with TAIL, a last block of at most BM / 2 rows is a tail of its own instead, numbered apart.
    e = tl.arange(0, E_POW2)
    valid = e < num_experts
    ends = tl.load(Ends + e, mask=valid, other=0)
    starts = tl.load(Ends + e - 1, mask=valid & (e > 0), other=0)
    count = tl.where(valid, ends - starts, 0)
    if TAIL:
        rest = count % BM
        blocks = count // BM + (rest > BM // 2).to(tl.int32)
        tails = ((rest > 0) & (rest <= BM // 2)).to(tl.int32)
    else:
        blocks = (count + BM - 1) // BM
        tails = tl.zeros_like(count)
    return e, starts, ends, blocks, tl.cumsum(blocks, 0), tails, tl.cumsum(tails, 0)


@triton.jit
def _tile_products(a_desc, X, b_desc, Order, row0, row_end, b_row, n_out, K, stride_x, GATED: tl.constexpr,
                   GATHER_TOP_K: tl.constexpr, SWAP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                   BK: tl.constexpr, WS: tl.constexpr = False):
    # The [BM, BN] products of a tile (gated: the gate's and the up's). SWAP computes them
    # transposed, the weights' BN rows as the MMA's tall side, so a tile of a few rows (BM down
    # to 16) is not padded to the 64 rows a Hopper MMA takes at the least; its A rows are then
    # loaded by pointer, as the gathering form's always are.
    if SWAP:
        acc = tl.zeros((BN, BM), dtype=tl.float32)
        acc_up = tl.zeros((BN, BM), dtype=tl.float32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        acc_up = tl.zeros((BM, BN), dtype=tl.float32)
    offs_k = tl.arange(0, BK)
    a_rows = row0 + tl.arange(0, BM)
    in_group = a_rows < row_end
    if GATHER_TOP_K > 0:
        a_src = tl.load(Order + a_rows, mask=in_group, other=0) // GATHER_TOP_K
    else:
        a_src = tl.where(in_group, a_rows, 0)
    a_ptrs = X + a_src.to(tl.int64)[:, None] * stride_x + offs_k[None, :]
    for k0 in tl.range(0, K, BK, warp_specialize=WS):  # WS: Triton's loads-MMA warp groups
        if GATHER_TOP_K > 0 or SWAP:
            a = tl.load(a_ptrs + k0, mask=in_group[:, None] & ((k0 + offs_k)[None, :] < K), other=0.0)
        else:
            a = a_desc.load([row0, k0])
        if SWAP:
            acc = tl.dot(b_desc.load([b_row, k0]), a.T, acc)
            if GATED:
                acc_up = tl.dot(b_desc.load([b_row + n_out, k0]), a.T, acc_up)
        else:
            acc = tl.dot(a, b_desc.load([b_row, k0]).T, acc)
            if GATED:
                acc_up = tl.dot(a, b_desc.load([b_row + n_out, k0]).T, acc_up)
    if SWAP:
        acc_rows, acc_up_rows = tl.trans(acc), tl.trans(acc_up)
    else:
        acc_rows, acc_up_rows = acc, acc_up
    return acc_rows, acc_up_rows


@triton.jit
def _store_tile(Out, Weights, Order, acc, acc_up, rows, keep, cols, n_out, stride_out, GATED: tl.constexpr):
    # The tile's rows that belong to its expert (`keep`); gated: silu(gate) * up * the routing weight.
    dtype = Out.dtype.element_ty
    if GATED:
        # as silu_mul_weight rounds the grouped GEMM's bf16 [gate | up] output
        gate = acc.to(dtype).to(tl.float32)
        up = acc_up.to(dtype).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
        act = (act * up).to(dtype).to(tl.float32)
        pair = tl.load(Order + rows, mask=keep, other=0)
        w = tl.load(Weights + pair, mask=keep, other=0.0).to(dtype).to(tl.float32)
        out = (act * w[:, None]).to(dtype)
    else:
        out = acc.to(dtype)
    mask = keep[:, None] & (cols < n_out)[None, :]
    tl.store(Out + rows[:, None].to(tl.int64) * stride_out + cols[None, :], out, mask=mask)


@triton.jit
def _gemm_tile(a_desc, X, b_desc, Out, Weights, Order, row0, row_end, b_row, col0, n_out, K, stride_x,
               stride_out, GATED: tl.constexpr, GATHER_TOP_K: tl.constexpr, SWAP: tl.constexpr,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, WS: tl.constexpr = False):
    # One BM x BN tile of one expert: rows [row0, row_end) of the sorted pairs (rows past it are
    # computed, not stored), columns from col0 of the weights' rows from b_row.
    acc, acc_up = _tile_products(a_desc, X, b_desc, Order, row0, row_end, b_row, n_out, K, stride_x, GATED,
                                 GATHER_TOP_K, SWAP, BM, BN, BK, WS)
    rows = row0 + tl.arange(0, BM)
    _store_tile(Out, Weights, Order, acc, acc_up, rows, rows < row_end, col0 + tl.arange(0, BN), n_out,
                stride_out, GATED)


@triton.jit
def _joint_gate_up_tile(b_joint_desc, X, Out, Weights, Order, row0, row_end, b_expert, col0, n_out, K, stride_x,
                        stride_out, GATHER_TOP_K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                        BK: tl.constexpr):
    # The gated tile with the gate's and the up's BN weights' rows in one TMA box of the
    # [experts, 2, I, K] view and one [BM, 2 * BN] product: each MMA reads the tile's A rows
    # from shared memory once for both halves, not once a half.
    acc = tl.zeros((BM, 2 * BN), dtype=tl.float32)
    offs_k = tl.arange(0, BK)
    rows = row0 + tl.arange(0, BM)
    keep = rows < row_end
    a_src = tl.load(Order + rows, mask=keep, other=0) // GATHER_TOP_K
    a_ptrs = X + a_src.to(tl.int64)[:, None] * stride_x + offs_k[None, :]
    for k0 in range(0, K, BK):
        a = tl.load(a_ptrs + k0, mask=keep[:, None] & ((k0 + offs_k)[None, :] < K), other=0.0)
        b = b_joint_desc.load([b_expert, 0, col0, k0]).reshape(2 * BN, BK)
        acc = tl.dot(a, b.T, acc)
    gate, up = tl.split(acc.reshape(BM, 2, BN).permute(0, 2, 1))
    _store_tile(Out, Weights, Order, gate, up, rows, keep, col0 + tl.arange(0, BN), n_out, stride_out, True)


@triton.jit
def _tail_tile(a_tail_desc, X, b_desc, Out, Weights, Order, row0, row_end, b_row, col0, n_out, K, stride_x,
               stride_out, GATED: tl.constexpr, GATHER_TOP_K: tl.constexpr, NARROW: tl.constexpr, BM: tl.constexpr,
               BN: tl.constexpr, BK: tl.constexpr):
    # An expert's last rows, at most BM / 2: a half-height tile, or with NARROW, if at most
    # BM / 4, a transposed tile BM / 4 wide (`_tile_products`).
    if NARROW:
        if row_end - row0 <= BM // 4:
            _gemm_tile(a_tail_desc, X, b_desc, Out, Weights, Order, row0, row_end, b_row, col0, n_out, K,
                       stride_x, stride_out, GATED, GATHER_TOP_K, True, BM // 4, BN, BK)
        else:
            _gemm_tile(a_tail_desc, X, b_desc, Out, Weights, Order, row0, row_end, b_row, col0, n_out, K,
                       stride_x, stride_out, GATED, GATHER_TOP_K, False, BM // 2, BN, BK)
    else:
        _gemm_tile(a_tail_desc, X, b_desc, Out, Weights, Order, row0, row_end, b_row, col0, n_out, K, stride_x,
                   stride_out, GATED, GATHER_TOP_K, False, BM // 2, BN, BK)


@triton.jit
def _block_major_tile(t, e_ids, starts, ends, blocks, cum, n_tiles, BM: tl.constexpr):
    # Tile t in block-major order: a row block's column tiles one after another.
    block = t // n_tiles
    expert = tl.sum((cum <= block).to(tl.int32), 0)  # cum is ascending: experts wholly before
    mine = e_ids == expert
    row0 = tl.sum(tl.where(mine, starts + (block - cum + blocks) * BM, 0), 0)
    return expert, row0, tl.sum(tl.where(mine, ends, 0), 0), t % n_tiles


@triton.jit
def _expert_major_tile(t, e_ids, starts, ends, blocks, cum, n_tiles, BM: tl.constexpr):
    # Tile t in expert-major order: an expert's tiles together, column after column, one
    # column's row blocks side by side, so programs that run at once read the same weights'
    # tile and HBM serves it once.
    expert = tl.sum((cum * n_tiles <= t).to(tl.int32), 0)
    mine = e_ids == expert
    n_blocks = tl.sum(tl.where(mine, blocks, 0), 0)
    local = t - tl.sum(tl.where(mine, cum - blocks, 0), 0) * n_tiles
    row0 = tl.sum(tl.where(mine, starts, 0), 0) + (local % n_blocks) * BM
    return expert, row0, tl.sum(tl.where(mine, ends, 0), 0), local // n_blocks


@triton.jit
def _grouped_gemm_tma_kernel(
    a_desc, a_tail_desc, X, b_desc, b_joint_desc, Out, Ends, Weights, Order, num_experts, n_out, b_rows_per_expert, K,
    stride_x, stride_out, num_programs,
    GATED: tl.constexpr, GATHER_TOP_K: tl.constexpr, E_POW2: tl.constexpr, BM: tl.constexpr,
    BN: tl.constexpr, BK: tl.constexpr, FLATTEN: tl.constexpr, TAIL: tl.constexpr, NARROW: tl.constexpr,
    WS: tl.constexpr, ORDER: tl.constexpr = 0, JOINT: tl.constexpr = False,
):
    # GATHER_TOP_K > 0: A's rows are read from X, each sorted pair's token (no TMA gather on
    # Hopper: plain loads, which Triton pipelines through shared memory as it does TMA's).
    # TAIL: an expert's last rows, if at most BM / 2, take a smaller tile (`_tail_tile`) after
    # every whole block. ORDER: the whole blocks' tiles block-major (0) or expert-major (1).
    # JOINT: the gated whole tiles' gate and up weights in one box, one product (`_joint_gate_up_tile`).
    e_ids, starts, ends, blocks, cum, tails, cum_tails = _expert_blocks(Ends, num_experts, E_POW2, BM, TAIL)
    n_tiles = tl.cdiv(n_out, BN)
    for t in tl.range(tl.program_id(0), tl.sum(blocks, 0) * n_tiles, num_programs, flatten=FLATTEN):
        if ORDER == 0:
            expert, row0, row_end, col_tile = _block_major_tile(t, e_ids, starts, ends, blocks, cum, n_tiles, BM)
        else:
            expert, row0, row_end, col_tile = _expert_major_tile(t, e_ids, starts, ends, blocks, cum, n_tiles, BM)
        col0 = col_tile * BN
        if JOINT:  # gathering and gated, whole tiles
            _joint_gate_up_tile(b_joint_desc, X, Out, Weights, Order, row0, row_end,
                                expert * (b_rows_per_expert > 0), col0, n_out, K, stride_x, stride_out, GATHER_TOP_K,
                                BM, BN, BK)
        else:
            _gemm_tile(a_desc, X, b_desc, Out, Weights, Order, row0, row_end, expert * b_rows_per_expert + col0,
                       col0, n_out, K, stride_x, stride_out, GATED, GATHER_TOP_K, False, BM, BN, BK, WS)
    if TAIL:
        for t in tl.range(tl.program_id(0), tl.sum(tails, 0) * n_tiles, num_programs):
            expert = tl.sum((cum_tails <= t // n_tiles).to(tl.int32), 0)
            mine = e_ids == expert
            row0 = tl.sum(tl.where(mine, starts + blocks * BM, 0), 0)
            row_end = tl.sum(tl.where(mine, ends, 0), 0)
            col0 = (t % n_tiles) * BN
            _tail_tile(a_tail_desc, X, b_desc, Out, Weights, Order, row0, row_end, expert * b_rows_per_expert + col0,
                       col0, n_out, K, stride_x, stride_out, GATED, GATHER_TOP_K, NARROW, BM, BN, BK)


# Launch settings. 128-row blocks at 8 warps won every size of bench_moe_tma's sweeps (2k-16k
# tokens, both presets' shapes; benchmarks/results/h200-2026-11-26-moe-tma/call1,
# h100-2026-11-26-moe-tma/call3); the gate/up GEMM's column tile is 128 wide (two accumulators),
# the down GEMM's 256, its tiles in one flattened loop. The gate/up GEMM, reading the tokens'
# rows itself, runs 4 pipeline stages deep (H200 call 12, H100 call 14: 2-8% faster than 3 at
# 2k-8k tokens). Its tiles go expert-major (`_expert_major_tile`), whole tiles: with the
# experts' weights never read from HBM again (every expert pointed at expert 0's) the GEMM at
# 4k tokens took 11-14% less than block-major, so side-by-side tiles of one column share its
# weights' tile. Expert-major whole tiles made the layer 0.1-5.6% faster at 2k-16k tokens on
# both GPUs, but for qwen3-30b-a3b's 4k on the H200 (-6.0% to +2.1% over five calls;
# benchmarks/results/h200-h100-2026-11-27-moe-order). Where an expert has under 64 rows on
# average, the H200 keeps the narrow tails it shipped before: an expert's last rows, if at most
# 32, in a transposed tile 32 wide (at 512 tokens 4-8% faster than whole tiles; no different at
# 1k). On the H100 tails were slower (h100-2026-11-26-pdl-tails/call3). The down GEMM stays
# block-major (expert-major up to 7% slower) and never takes tails; its depth is the GPU's: the
# H100's slower memory wants a fourth stage (calls 4-6: qwen3-30b-a3b's 8k-token down GEMM
# 419-421 against 438-456 us), the H200 three (call 1: 417 against 428). The gate/up whole tiles
# take their gate's and up's weights in one box and one 128x256 product (`_joint_gate_up_tile`),
# so each MMA reads the tile's token rows once, not twice: the layer 0.4-3.4% faster on the H100
# at 1k-8k tokens and on the H200 by up to 5.2% (all but qwen3-30b-a3b's 8k, even), the same
# bits (benchmarks/results/h200-h100-2026-11-27-moe-joint, calls 5-6). An expert's last rows,
# up to 32, riding on its last whole block's loop transposed: the gate/up GEMM 8-17% slower at
# 4k-8k tokens on the H200, 5-10% faster only at qwen3-30b-a3b's 2k (call 1; code in 2b652db).
_GATED_TILES = {"block_n": 128, "num_warps": 8, "flatten": False, "num_stages": 4, "tail": False,
                "narrow_tail": False, "tile_order": 1, "joint_gate_up": True}
_NARROW_TAILS = {"tail": True, "narrow_tail": True, "tile_order": 0, "joint_gate_up": False}
NARROW_TAILS_BELOW_ROWS = 64  # an expert's mean rows under which the H200 takes narrow tails
_DOWN_TILES = {"block_n": 256, "num_warps": 8, "flatten": True, "tail": False}


def launch_tiles(device_index: int, mean_rows: float) -> tuple[dict, dict]:
    """(gate/up, down) launch settings for `tma_grouped_mm` on this GPU, for GEMMs whose experts
    have `mean_rows` rows on average."""
    h100 = is_h100(device_index)
    gated = {**_GATED_TILES, **(_NARROW_TAILS if not h100 and mean_rows < NARROW_TAILS_BELOW_ROWS else {})}
    return gated, {**_DOWN_TILES, "num_stages": 4 if h100 else 3}


def tma_usable(x: torch.Tensor, *weights: torch.Tensor) -> bool:
    """Whether this Triton builds host tensor maps and the operands live where TMA runs: on the
    GPU (the grouped path asks for Hopper or later before it gets here), the weights whole and
    16-byte aligned as a tensor map's base must be."""
    if TensorDescriptor is None or x.device.type != "cuda":
        return False
    return all(w.is_contiguous() and w.data_ptr() % 16 == 0 for w in weights)


@cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def tma_grouped_mm(
    rows: torch.Tensor,  # [pairs, K] bf16, each expert's rows together, experts ascending
    weights: torch.Tensor,  # [E, N, K] (gated: [E, 2 * I, K])
    ends: torch.Tensor,  # [E] int32: one past each expert's last row
    *,
    gated: bool = False,
    pair_weights: torch.Tensor | None = None,  # gated: fp32 [pairs] routing weights, flat
    order: torch.Tensor | None = None,  # gated or gathering: the pair at each sorted row
    gather_top_k: int = 0,  # > 0: `rows` are the [tokens, K] tokens, pair p's row is token p // k
    block_m: int = 128,
    block_n: int = 128,
    block_k: int = 64,
    num_warps: int = 8,
    num_stages: int = 4,
    flatten: bool = False,
    tail: bool = False,
    narrow_tail: bool = False,  # with tail: tails of at most block_m / 4 rows in transposed tiles
    num_programs: int | None = None,
    warp_specialize: bool = False,  # whole blocks' K loops in Triton's warp-specialized form
    tile_order: int = 0,  # whole blocks' tiles: 0 block-major, 1 expert-major
    joint_gate_up: bool = False,  # gathering gated whole tiles: gate and up weights in one box, one product
    b_rows_per_expert: int | None = None,  # probes only: 0 points every expert at expert 0's weights
) -> torch.Tensor:
    """[pairs, N] = each row times its expert's weights transposed; gated: [pairs, I] =
    silu(gate) * up * the pair's routing weight."""
    assert not narrow_tail or (tail and block_m >= 64), "narrow tails are tails, at least 16 rows wide"
    pairs, k = (order.numel(), rows.shape[1]) if gather_top_k else rows.shape
    num_experts, b_rows = weights.shape[0], weights.shape[1]
    n_out = b_rows // 2 if gated else b_rows
    out = torch.empty((pairs, n_out), dtype=rows.dtype, device=rows.device)
    a_desc = None if gather_top_k else TensorDescriptor.from_tensor(rows, [block_m, block_k])
    a_tail_desc = TensorDescriptor.from_tensor(rows, [block_m // 2, block_k]) if tail and not gather_top_k else None
    b_desc = TensorDescriptor.from_tensor(weights.reshape(num_experts * b_rows, k), [block_n, block_k])
    assert not joint_gate_up or (gated and gather_top_k and not tail), "joint gate/up: gathering, gated, whole"
    b_joint_desc = (TensorDescriptor.from_tensor(weights.view(num_experts, 2, n_out, k), [1, 2, block_n, block_k])
                   if joint_gate_up else None)
    max_tiles = (cdiv(pairs, block_m) + num_experts) * cdiv(n_out, block_n)
    if num_programs is None:
        num_programs = _num_sms(rows.device.index) if rows.device.type == "cuda" else 4
    grid = (max(1, min(num_programs, max_tiles)),)
    dummy = ends  # the plain form reads no routing weights
    _grouped_gemm_tma_kernel[grid](
        a_desc, a_tail_desc, rows, b_desc, b_joint_desc, out, ends, pair_weights if gated else dummy,
        order if order is not None else dummy, num_experts, n_out,
        b_rows if b_rows_per_expert is None else b_rows_per_expert, k, rows.stride(0), out.stride(0),
        grid[0], GATED=gated, GATHER_TOP_K=gather_top_k, E_POW2=next_power_of_2(num_experts), BM=block_m,
        BN=block_n, BK=block_k, TAIL=tail, NARROW=narrow_tail, WS=warp_specialize,
        FLATTEN=flatten, ORDER=tile_order, JOINT=joint_gate_up, num_warps=num_warps, num_stages=num_stages,
    )
    return out
