"""Extend-sized MoE experts as grouped GEMMs over each expert's sorted rows.

From a few hundred tokens an expert gets tens to hundreds of rows and the layer is its GEMMs.
cgtool's Triton MoE GEMM (moe_triton), which gathers and aligns rows per block, ran there near
half of `torch.mm`'s rate (issue 33, docs/moe-mla.md). The layer here is:

  sort the (token, slot) pairs by expert (a counting sort: every expert's rows contiguous, no
  padding); on the GPU, cgtool's TMA grouped GEMMs (moe_tma_gemm): the gate/up one reading each
  pair's token row and writing silu(gate) * up * the routing weight, then the down one; each
  token's top-k rows summed through the inverse of the sort (one kernel). Where TMA does not
  run (the CPU tests), torch's grouped GEMM on gathered rows and a SiLU kernel, which give the
  same bits.

Every shape is the token count's and every count stays on the device, so it captures. Each
pair's down output is rounded to bf16 before the top-k sum, one rounding more than the Triton
path; tests hold both to the fp32 reference's tolerance.
"""

from __future__ import annotations

from functools import cache

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from cgtool.model.moe_tma_gemm import launch_tiles, tma_grouped_mm, tma_usable
from cgtool.runtime.triton_launch import CachedKernel, cdiv, next_power_of_2

_GROUPED_MM = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
# Where the grouped path runs: an expert's mean rows at least this. Below it the Triton path was
# faster, above it the grouped path, on both GPU classes with each one's launch settings
# (2026-11-26, us a layer, grouped against Triton; H200 benchmarks/results/h200-2026-11-26-moe-tma/
# call13, H100 call7 and call5): qwen3-30b-a3b at 512 tokens (32 mean rows) 349 / 389, 524 / 540
# and 511 / 541; at 256 (16) 358 / 342 and 535 / 483; deepseek-v2-lite at 512 (48) 327 / 350,
# 481 / 493 and 479 / 494; at 256 (24) 329 / 316 and 488 / 447.
GROUPED_MIN_MEAN_ROWS = 32


def grouped_mm_chosen(num_pairs: int, num_experts: int) -> bool:
    """Whether a layer of these shapes takes the grouped path (where `grouped_mm_usable`)."""
    return num_pairs >= GROUPED_MIN_MEAN_ROWS * num_experts


def grouped_mm_usable(x: torch.Tensor, gate_up: torch.Tensor) -> bool:
    """torch's grouped GEMM takes bf16 only, with rows of whole 16-byte steps; on CUDA its fast
    kernel needs Hopper or later (older GPUs fall back to a loop of GEMMs, slower than the
    Triton path)."""
    if _GROUPED_MM is None or x.dtype != torch.bfloat16 or gate_up.dtype != torch.bfloat16:
        return False
    if gate_up.shape[-1] % 8 or gate_up.shape[1] % 16:  # its operands' rows in 16-byte steps
        return False
    if x.device.type == "cuda":
        return _hopper_or_later(x.device.index)
    return x.device.type == "cpu"  # torch's reference loop: lets the tests run the path


@cache
def _hopper_or_later(device_index: int) -> bool:  # asked once a device, not every forward
    return torch.cuda.get_device_capability(device_index)[0] >= 9


@triton.jit
def _silu_mul_weight_kernel(GateUp, Weights, Order, Out, inter, stride_g, BLOCK: tl.constexpr):
    # Out[r] = (silu(gate) * up) * w, each product rounded to Out's dtype as the reference
    # rounds: silu_and_mul_ref's two ops, then the routing weight cast to the activations' dtype.
    r = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inter
    gate = tl.load(GateUp + r * stride_g + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(GateUp + r * stride_g + inter + offs, mask=mask, other=0.0).to(tl.float32)
    dtype = Out.dtype.element_ty
    act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    act = (act * up).to(dtype).to(tl.float32)
    w = tl.load(Weights + tl.load(Order + r)).to(dtype).to(tl.float32)
    tl.store(Out + r * inter + offs, (act * w).to(dtype), mask=mask)


@triton.jit
def _sum_sorted_rows_kernel(Y, Inverse, Out, hidden, TOP_K: tl.constexpr, BLOCK: tl.constexpr):
    # Out[t] = Σ_j Y[Inverse[t * TOP_K + j]] in fp32, slots in order, rounded once.
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < hidden
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        row = tl.load(Inverse + t * TOP_K + j)
        acc += tl.load(Y + row * hidden + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(Out + t * hidden + offs, acc.to(Out.dtype.element_ty), mask=mask)


@triton.jit
def _gather_rows_kernel(X, Order, Out, hidden, stride_x, TOP_K: tl.constexpr, BLOCK: tl.constexpr):
    # Out[r] = X[Order[r] // TOP_K]: each sorted pair's token row.
    r = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < hidden
    token = tl.load(Order + r) // TOP_K
    tl.store(Out + r * hidden + offs, tl.load(X + token * stride_x + offs, mask=mask), mask=mask)


_GATHER_ROWS = CachedKernel(_gather_rows_kernel)
_SILU_MUL_WEIGHT = CachedKernel(_silu_mul_weight_kernel)
_SUM_SORTED_ROWS = CachedKernel(_sum_sorted_rows_kernel)


# A counting sort's chunk of pairs: its histogram and its stable local sort run in one program.
# 256 was the fastest of 256-2,048 at every size of both presets' shapes, 2k-16k tokens, but one
# within 1% (H100, 2026-11-26, benchmarks/results/h100-2026-11-26-moe-tma/call4: 6.5-11.6 us).
_CHUNK = 256
_SCAN_BLOCK = 1024


@triton.jit
def _chunk_counts_kernel(Ids, Counts, num_pairs, CHUNK: tl.constexpr, E_POW2: tl.constexpr):
    # Counts[c, e]: pairs of chunk c routed to expert e
    c = tl.program_id(0)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    valid = offs < num_pairs
    ids = tl.load(Ids + offs, mask=valid, other=0).to(tl.int32)
    tl.store(Counts + c * E_POW2 + tl.arange(0, E_POW2), tl.histogram(ids, E_POW2, mask=valid))


@triton.jit
def _chunk_scan_kernel(Counts, Before, Totals, num_chunks, E_POW2: tl.constexpr, BLOCK: tl.constexpr):
    # for expert e (one program): Before[c, e] = pairs of e in chunks before c; Totals[e]
    e = tl.program_id(0)
    carry = 0
    for c0 in range(0, num_chunks, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        counts = tl.load(Counts + c * E_POW2 + e, mask=c < num_chunks, other=0)
        tl.store(Before + c * E_POW2 + e, carry + tl.cumsum(counts, 0) - counts, mask=c < num_chunks)
        carry += tl.sum(counts, 0)
    tl.store(Totals + e, carry)


@triton.jit
def _place_pairs_kernel(Ids, Counts, Before, Totals, Order, Inverse, Ends, num_pairs, num_experts,
                        CHUNK: tl.constexpr, E_POW2: tl.constexpr):
    # The chunk sorted locally by (expert, pair), so the order is torch.sort's stable one; a
    # pair's row is its expert's start, its expert's pairs in earlier chunks, and its place
    # among its expert's pairs in this chunk.
    c = tl.program_id(0)
    experts = tl.arange(0, E_POW2)
    totals = tl.load(Totals + experts)
    ends = tl.cumsum(totals, 0)
    if c == 0:
        tl.store(Ends + experts, ends, mask=experts < num_experts)
    counts = tl.load(Counts + c * E_POW2 + experts)
    base = ends - totals + tl.load(Before + c * E_POW2 + experts) - (tl.cumsum(counts, 0) - counts)
    local = tl.arange(0, CHUNK)
    offs = c * CHUNK + local
    ids = tl.load(Ids + offs, mask=offs < num_pairs, other=E_POW2).to(tl.int32)
    keys = tl.sort(ids * CHUNK + local)
    expert = keys // CHUNK
    pair = c * CHUNK + keys % CHUNK
    rows = tl.gather(base, tl.minimum(expert, E_POW2 - 1), 0) + local
    valid = expert < E_POW2
    tl.store(Order + rows, pair, mask=valid)
    tl.store(Inverse + pair, rows, mask=valid)


_CHUNK_COUNTS = CachedKernel(_chunk_counts_kernel)
_CHUNK_SCAN = CachedKernel(_chunk_scan_kernel)
_PLACE_PAIRS = CachedKernel(_place_pairs_kernel)


def sort_pairs(ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(order, inverse, ends) of the flat (token, slot) pairs: `order[r]` is the pair at sorted
    row r (experts ascending, pairs in order within one), `inverse` its inverse, and `ends[e]`
    one past expert e's last row (int32, the grouped GEMM's offsets).

    A counting sort in three launches (chunk counts, their scan per expert, placement), where
    torch.sort, searchsorted and the inverse's scatter took 55-60 us at 1k-16k tokens on an
    H200 and an H100 (benchmarks/results/h200-2026-11-26-moe-grouped/call2, call 4 above)."""
    flat = ids.reshape(-1)
    num_pairs, device = flat.numel(), flat.device
    e_pow2 = next_power_of_2(num_experts)
    chunk = min(_CHUNK, max(16, next_power_of_2(num_pairs)))
    num_chunks = cdiv(num_pairs, chunk)
    counts = torch.empty((num_chunks, e_pow2), dtype=torch.int32, device=device)
    before = torch.empty_like(counts)
    totals = torch.empty(e_pow2, dtype=torch.int32, device=device)
    order = torch.empty(num_pairs, dtype=torch.int32, device=device)
    inverse = torch.empty_like(order)
    ends = torch.empty(num_experts, dtype=torch.int32, device=device)
    _CHUNK_COUNTS.launch((num_chunks,), flat, counts, num_pairs, CHUNK=chunk, E_POW2=e_pow2, num_warps=4)
    _CHUNK_SCAN.launch((e_pow2,), counts, before, totals, num_chunks, E_POW2=e_pow2, BLOCK=_SCAN_BLOCK,
                       num_warps=4)
    _PLACE_PAIRS.launch((num_chunks,), flat, counts, before, totals, order, inverse, ends, num_pairs,
                        num_experts, CHUNK=chunk, E_POW2=e_pow2, num_warps=4)
    return order, inverse, ends


def gather_rows(x: torch.Tensor, order: torch.Tensor, top_k: int) -> torch.Tensor:
    """[pairs, hidden]: row r is the token row of the pair `order[r]`."""
    hidden = x.shape[1]
    rows = torch.empty((order.numel(), hidden), dtype=x.dtype, device=x.device)
    block = min(1024, next_power_of_2(hidden))
    _GATHER_ROWS.launch((order.numel(), cdiv(hidden, block)), x, order, rows, hidden, x.stride(0),
                        TOP_K=top_k, BLOCK=block, num_warps=4)
    return rows


def silu_mul_weight(h: torch.Tensor, weights: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """[pairs, I] from the gate/up GEMM's [pairs, 2 * I]: silu(gate) * up times each sorted
    pair's routing weight (`weights` flat fp32 [pairs], read at `order`)."""
    pairs, inter = h.shape[0], h.shape[1] // 2
    act = torch.empty((pairs, inter), dtype=h.dtype, device=h.device)
    block = min(1024, next_power_of_2(inter))
    _SILU_MUL_WEIGHT.launch((pairs, cdiv(inter, block)), h, weights, order, act, inter, h.stride(0),
                            BLOCK=block, num_warps=4)
    return act


def sum_sorted_rows(y: torch.Tensor, inverse: torch.Tensor, top_k: int, dtype: torch.dtype) -> torch.Tensor:
    """[tokens, hidden]: each token's top_k rows of the sorted `y`, summed in slot order."""
    pairs, hidden = y.shape
    out = torch.empty((pairs // top_k, hidden), dtype=dtype, device=y.device)
    block = min(1024, next_power_of_2(hidden))
    _SUM_SORTED_ROWS.launch((out.shape[0], cdiv(hidden, block)), y, inverse, out, hidden,
                            TOP_K=top_k, BLOCK=block, num_warps=4)
    return out


def grouped_mm_experts(
    x: torch.Tensor,  # [n, hidden] bf16
    gate_up: torch.Tensor,  # [E, 2 * I, hidden]
    down: torch.Tensor,  # [E, hidden, I]
    weights: torch.Tensor,  # [n, top_k] fp32
    ids: torch.Tensor,  # [n, top_k]
) -> torch.Tensor:
    """`moe.experts_ref` of the same arguments on a grouped GEMM: [n, hidden]. On a GPU the
    GEMMs are cgtool's TMA kernels (`moe_tma_gemm`), the gate/up one writing the activations;
    elsewhere torch's grouped GEMM and `silu_mul_weight`, which give the same bits."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    top_k = ids.shape[1]
    order, inverse, ends = sort_pairs(ids, gate_up.shape[0])
    flat_weights = weights.float().reshape(-1).contiguous()
    if tma_usable(x, gate_up, down):
        gated_tiles, down_tiles = launch_tiles(x.device.index, order.numel() / gate_up.shape[0])
        # the gate/up GEMM reads each pair's token row itself: no [pairs, hidden] copy
        act = tma_grouped_mm(x, gate_up, ends, gated=True, pair_weights=flat_weights, order=order,
                             gather_top_k=top_k, **gated_tiles)
        y = tma_grouped_mm(act, down, ends, **down_tiles)
    else:
        rows = gather_rows(x, order, top_k)  # [pairs, hidden], each expert's rows together
        # Weights stored [E, out, in] are the column-major [E, in, out] operand torch wants.
        h = _GROUPED_MM(rows, gate_up.transpose(1, 2), offs=ends)  # [pairs, 2 * I]
        del rows
        act = silu_mul_weight(h, flat_weights, order)
        del h
        y = _GROUPED_MM(act, down.transpose(1, 2), offs=ends)  # [pairs, hidden]
    del act  # each buffer freed once read, so the next reuses it: a smaller graph pool
    return sum_sorted_rows(y, inverse, top_k, x.dtype)
