"""Fused MoE experts in Triton: align token-expert pairs into blocks, then one grouped GEMM.

The torch reference (`moe.experts_ref`) runs every expert over every token. Here each
(token, top-k slot) pair is sorted by its expert into blocks of BLOCK_M rows, every expert's
rows padded up to a whole block, as SGLang's and vLLM's `moe_align_block_size` do. One
program of the grouped GEMM multiplies one block by its expert's weights, so only the
experts the batch routed to are read. Shapes stay static for CUDA graphs: the number of
blocks is bounded by its worst case for the token count, every count stays on the device,
and the blocks past the real total return at once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cgtool.model.fused import silu_and_mul
from cgtool.runtime.triton_launch import CachedKernel, cdiv, next_power_of_2

# Untuned: SGLang's default fused-MoE config for small batches, not yet swept on the H100.
BLOCK_N, BLOCK_K, NUM_WARPS = 64, 64, 4
# tl.dot needs at least 16 rows.
MIN_BLOCK_M, MAX_BLOCK_M = 16, 64


def block_m_for(num_pairs: int, num_experts: int) -> int:
    """Rows a block holds: about the mean rows an expert gets, since past that a block of
    one expert is mostly padding. Fixed by the shapes, so a captured grid stays valid."""
    mean_rows = next_power_of_2(cdiv(num_pairs, num_experts))
    return max(MIN_BLOCK_M, min(MAX_BLOCK_M, mean_rows))


def max_padded_pairs(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Worst case of the aligned length: each expert that gets a pair (at most one per pair)
    pads its rows by up to block_m - 1."""
    padded = num_pairs + min(num_experts, num_pairs) * (block_m - 1)
    return cdiv(padded, block_m) * block_m


def align_block_size(
    ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sorted_pair_ids, block_experts, num_padded) for expert ids [n, top_k].

    sorted_pair_ids [max_padded]: flat pair indices (token * top_k + slot) grouped by expert,
    each expert's run padded to a multiple of block_m with n * top_k, an index past the end.
    block_experts [max_padded / block_m]: the expert of each block.
    num_padded [1]: the aligned length in use; the blocks past it hold only padding.
    No op here reads a count on the host (bincount would, to size its output).
    """
    experts = ids.flatten().long()  # [num_pairs]
    num_pairs, device = experts.numel(), ids.device
    counts = torch.zeros(num_experts, dtype=torch.long, device=device)
    counts.scatter_add_(0, experts, torch.ones_like(experts))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_ends = padded.cumsum(0)
    order = torch.argsort(experts, stable=True)  # pair indices grouped by expert
    sorted_experts = experts[order]
    first_of_expert = counts.cumsum(0) - counts
    rank = torch.arange(num_pairs, device=device) - first_of_expert[sorted_experts]
    dest = (padded_ends - padded)[sorted_experts] + rank
    max_padded = max_padded_pairs(num_pairs, num_experts, block_m)
    sorted_pair_ids = torch.full((max_padded,), num_pairs, dtype=torch.int32, device=device)
    sorted_pair_ids.scatter_(0, dest, order.int())
    block_starts = torch.arange(0, max_padded, block_m, device=device)
    # Blocks past num_padded would search past the last expert: clamped, and never run.
    block_experts = torch.searchsorted(padded_ends, block_starts, right=True)
    block_experts = block_experts.clamp_max(num_experts - 1).int()
    return sorted_pair_ids, block_experts, padded_ends[-1:].int()


@triton.jit
def _grouped_gemm_kernel(
    A, B, C, sorted_pair_ids, block_experts, num_padded, pair_weights,
    num_pairs, N, K, stride_am, stride_be, stride_bn, stride_cm,
    PAIRS_PER_ROW: tl.constexpr, MUL_WEIGHT: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # C[pair, :] = A[pair // PAIRS_PER_ROW, :] @ B[expert].T for the pairs of one block.
    pid_m = tl.program_id(0)
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
    for k0 in range(0, K, BLOCK_K):
        mask_k = offs_k < K - k0
        a = tl.load(a_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if MUL_WEIGHT:
        acc = acc * tl.load(pair_weights + pairs, mask=mask_m, other=0.0)[:, None]
    c_ptrs = C + pairs.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


_GROUPED_GEMM = CachedKernel(_grouped_gemm_kernel)


def _grouped_gemm(
    a: torch.Tensor, w: torch.Tensor, out: torch.Tensor, align: tuple[torch.Tensor, ...],
    pair_weights: torch.Tensor, pairs_per_row: int, block_m: int, mul_weight: bool,
) -> None:
    sorted_pair_ids, block_experts, num_padded = align
    assert a.stride(-1) == 1 and w.stride(-1) == 1 and out.stride(-1) == 1
    n_out, k_in = w.shape[1], w.shape[2]
    grid = (block_experts.numel(), cdiv(n_out, BLOCK_N))
    # fp32 weights take exact fp32 products: TF32 would drift from the reference.
    precision = "ieee" if a.dtype == torch.float32 else "tf32"
    _GROUPED_GEMM.launch(
        grid, a, w, out, sorted_pair_ids, block_experts, num_padded, pair_weights,
        out.shape[0], n_out, k_in, a.stride(0), w.stride(0), w.stride(1), out.stride(0),
        PAIRS_PER_ROW=pairs_per_row, MUL_WEIGHT=mul_weight, PRECISION=precision,
        BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, num_warps=NUM_WARPS,
    )


def _launch_fused_experts(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, weights: torch.Tensor,
    ids: torch.Tensor,
) -> torch.Tensor:
    x = x if x.stride(-1) == 1 else x.contiguous()
    num_tokens, top_k = ids.shape
    num_experts, num_pairs, hidden = gate_up.shape[0], ids.numel(), x.shape[1]
    block_m = block_m_for(num_pairs, num_experts)
    align = align_block_size(ids, num_experts, block_m)
    pair_weights = weights.float().contiguous()  # [num_pairs] read flat, fp32 as routed
    h = torch.empty((num_pairs, gate_up.shape[1]), dtype=x.dtype, device=x.device)  # [pairs, 2I]
    _grouped_gemm(x, gate_up, h, align, pair_weights, top_k, block_m, mul_weight=False)
    act = silu_and_mul(h)  # [pairs, I]
    # fp32 partial outputs, so the top-k sum rounds once, as the reference's einsum does.
    y = torch.empty((num_pairs, hidden), dtype=torch.float32, device=x.device)  # [pairs, hidden]
    _grouped_gemm(act, down, y, align, pair_weights, 1, block_m, mul_weight=True)
    return y.view(num_tokens, top_k, hidden).sum(dim=1).to(x.dtype)


def fused_experts(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, weights: torch.Tensor,
    ids: torch.Tensor,
) -> torch.Tensor:
    """`moe.experts_ref` of the same arguments, reading only the routed experts' weights."""
    if torch.compiler.is_compiling():
        # One opaque node for dynamo; eager calls skip the custom op's dispatch cost.
        return torch.ops.cgtool.fused_experts(x, gate_up, down, weights, ids)
    return _launch_fused_experts(x, gate_up, down, weights, ids)


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
