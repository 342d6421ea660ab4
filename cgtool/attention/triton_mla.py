"""MLA attention over the latent KV pool: every query head attends one shared latent head.

Each slot of layer l holds one latent row of `rank + rope` values (kv_lora_rank 512 plus
qk_rope_head_dim 64 for DeepSeek). A query head's score against a token is its dot with the
whole row; its output is the softmax-weighted sum of the rows' first `rank` values. So one
latent row read from memory serves as the key and the value of all heads at once, and the
kernels read it once per block of heads, never a separate V.

The 576 values are not a power of two: the row is handled as a `rank` part and a `rope`
part, each padded to its own power of two, so neither pays for the other's padding.

Decode splits each request's context into `num_kv_splits` chunks (fixed by the batch size)
and merges them by log-sum-exp with the dense decode kernel's stage 2; grids depend only on
the batch size and chunk bounds come from `seq_lens` in the kernel, so a decode graph
captured at one batch size replays for any lengths. Extend (eager, between piecewise graph
pieces) is causal over prefix plus new tokens, one program per (head, request, query block).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cgtool.attention.triton_decode import _STAGE2, LOG2_E
from cgtool.attention.triton_softmax import online_softmax_step
from cgtool.triton_launch import CachedKernel

# Heads of one program: tl.dot needs 16 rows, and 16 heads x 512 fp32 accumulators fit the
# registers of 4 warps.
BLOCK_H = 16
# tl.dot needs at least 16 along every dimension: narrower parts are padded with masked lanes.
MIN_DOT = 16
# Keys per step: a [32, 512] bf16 latent tile is 32 KiB of shared memory per pipeline stage.
DECODE_BLOCK_N = 32
EXTEND_BLOCK_M, EXTEND_BLOCK_N = 32, 32
# A [32, 512] fp32 accumulator plus its [32, 576] query is ~200 registers a thread at 4 warps;
# 8 warps halve that. Not tuned on the GPU yet.
EXTEND_WARPS = 8


@triton.jit
def _latent_block(
    Kv, token_row, offs_n, mask_n, offs_r, mask_r, offs_p, mask_p, stride_kt, RANK: tl.constexpr,
):
    """One block of latent rows: ([BLOCK_N, BLOCK_R] rank part, [BLOCK_N, BLOCK_P] rope part)."""
    # int64: slot * stride overflows int32 on pools of a few million tokens.
    slots = tl.load(token_row + offs_n, mask=mask_n, other=0).to(tl.int64)
    rows = Kv + slots[:, None] * stride_kt
    kv = tl.load(rows + offs_r[None, :], mask=mask_n[:, None] & mask_r[None, :], other=0.0)
    pe = tl.load(rows + RANK + offs_p[None, :], mask=mask_n[:, None] & mask_p[None, :], other=0.0)
    return kv, pe


@triton.jit
def _mla_decode_stage1(
    Q, Kv, MidOut, MidLse, req_to_token, req_pool_indices, seq_lens, scale_log2,
    stride_qb, stride_qh, stride_kt, stride_req, stride_mb, stride_mh, stride_ms,
    stride_lb, stride_lh,
    NUM_HEADS: tl.constexpr, RANK: tl.constexpr, ROPE: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
):
    b = tl.program_id(0)
    head_block = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens + b)
    split_len = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    split_start = split * split_len
    split_end = tl.minimum(split_start + split_len, seq_len)
    if split_end <= split_start:
        return  # stage 2 skips empty chunks

    heads = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = heads < NUM_HEADS
    offs_r = tl.arange(0, BLOCK_R)
    mask_r = offs_r < RANK
    offs_p = tl.arange(0, BLOCK_P)
    mask_p = offs_p < ROPE
    q_rows = Q + b * stride_qb + heads[:, None] * stride_qh
    q_r = tl.load(q_rows + offs_r[None, :], mask=mask_h[:, None] & mask_r[None, :], other=0.0)
    q_p = tl.load(q_rows + RANK + offs_p[None, :], mask=mask_h[:, None] & mask_p[None, :], other=0.0)
    token_row = req_to_token + tl.load(req_pool_indices + b).to(tl.int64) * stride_req

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_R], dtype=tl.float32)
    for start_n in range(split_start, split_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        mask_n = offs_n < split_end
        kv, pe = _latent_block(
            Kv, token_row, offs_n, mask_n, offs_r, mask_r, offs_p, mask_p, stride_kt, RANK
        )
        s = tl.dot(q_r, tl.trans(kv).to(q_r.dtype)) + tl.dot(q_p, tl.trans(pe).to(q_p.dtype))
        s = tl.where(mask_n[None, :], s * scale_log2, float("-inf"))
        acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, s, kv)

    tl.store(
        MidOut + b * stride_mb + heads[:, None] * stride_mh + split * stride_ms + offs_r[None, :],
        acc / l_i[:, None], mask=mask_h[:, None] & mask_r[None, :],
    )
    tl.store(MidLse + b * stride_lb + heads * stride_lh + split, m_i + tl.log2(l_i), mask=mask_h)


@triton.jit
def _mla_extend_kernel(
    Q, Kv, O, req_to_token, req_pool_indices, prefix_lens, extend_lens, start_loc, scale_log2,
    stride_qt, stride_qh, stride_kt, stride_ot, stride_oh, stride_req,
    RANK: tl.constexpr, ROPE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    head = tl.program_id(0)
    b = tl.program_id(1)
    block_m = tl.num_programs(2) - 1 - tl.program_id(2)  # heaviest causal blocks first
    extend_len = tl.load(extend_lens + b)
    if block_m * BLOCK_M >= extend_len:
        return  # the grid is sized for the longest request of the batch

    prefix = tl.load(prefix_lens + b)
    token_row = req_to_token + tl.load(req_pool_indices + b).to(tl.int64) * stride_req
    offs_m = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < extend_len
    q_pos = prefix + offs_m
    rows = (tl.load(start_loc + b) + offs_m).to(tl.int64)
    offs_r = tl.arange(0, BLOCK_R)
    mask_r = offs_r < RANK
    offs_p = tl.arange(0, BLOCK_P)
    mask_p = offs_p < ROPE
    q_rows = Q + rows[:, None] * stride_qt + head * stride_qh
    q_r = tl.load(q_rows + offs_r[None, :], mask=mask_m[:, None] & mask_r[None, :], other=0.0)
    q_p = tl.load(q_rows + RANK + offs_p[None, :], mask=mask_m[:, None] & mask_p[None, :], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
    kv_end = prefix + tl.minimum(extend_len, (block_m + 1) * BLOCK_M)
    for start_n in range(0, kv_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        mask_n = offs_n < kv_end
        kv, pe = _latent_block(
            Kv, token_row, offs_n, mask_n, offs_r, mask_r, offs_p, mask_p, stride_kt, RANK
        )
        s = tl.dot(q_r, tl.trans(kv).to(q_r.dtype)) + tl.dot(q_p, tl.trans(pe).to(q_p.dtype))
        # Key 0 is visible to every query, so no row is ever fully masked (no NaN).
        visible = mask_n[None, :] & (offs_n[None, :] <= q_pos[:, None])
        s = tl.where(visible, s * scale_log2, float("-inf"))
        acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, s, kv)

    tl.store(
        O + rows[:, None] * stride_ot + head * stride_oh + offs_r[None, :],
        (acc / l_i[:, None]).to(O.dtype.element_ty), mask=mask_m[:, None] & mask_r[None, :],
    )


_MLA_STAGE1 = CachedKernel(_mla_decode_stage1)
_MLA_EXTEND = CachedKernel(_mla_extend_kernel)


def _check_layout(q: torch.Tensor, latent_cache: torch.Tensor, out: torch.Tensor, rank: int) -> int:
    """The rope width; the latent pool holds one head of rank + rope values."""
    assert latent_cache.shape[1] == 1, "the latent pool holds one head"
    assert q.shape[-1] == latent_cache.shape[-1] and out.shape[-1] == rank
    assert q.stride(-1) == latent_cache.stride(-1) == out.stride(-1) == 1
    return latent_cache.shape[-1] - rank


def _part_blocks(rank: int, rope: int) -> tuple[int, int]:
    return max(MIN_DOT, triton.next_power_of_2(rank)), max(MIN_DOT, triton.next_power_of_2(rope))


def mla_decode_attention(
    q: torch.Tensor,  # [bs, heads, rank + rope]
    latent_cache: torch.Tensor,  # [num_slots, 1, rank + rope]
    out: torch.Tensor,  # [bs, heads, rank], written in place
    req_to_token: torch.Tensor,  # [max_reqs, max_context_len] int32
    req_pool_indices: torch.Tensor,  # [bs]
    seq_lens: torch.Tensor,  # [bs] int32, including the new token
    sm_scale: float,
    mid_out: torch.Tensor,  # [bs, heads, num_kv_splits, rank] fp32 scratch
    mid_lse: torch.Tensor,  # [bs, heads, num_kv_splits] fp32 scratch
) -> None:
    """One query per request over latent rows 0..seq_lens[b]-1; no host synchronisation."""
    bs, num_heads, _ = q.shape
    rank = out.shape[-1]
    rope = _check_layout(q, latent_cache, out, rank)
    num_splits = mid_out.shape[2]
    assert num_splits & (num_splits - 1) == 0, "num_kv_splits must be a power of two"
    assert req_to_token.stride(1) == 1
    block_r, block_p = _part_blocks(rank, rope)
    _MLA_STAGE1.launch(
        (bs, triton.cdiv(num_heads, BLOCK_H), num_splits), q, latent_cache, mid_out, mid_lse,
        req_to_token, req_pool_indices, seq_lens, sm_scale * LOG2_E,
        q.stride(0), q.stride(1), latent_cache.stride(0), req_to_token.stride(0),
        mid_out.stride(0), mid_out.stride(1), mid_out.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        NUM_HEADS=num_heads, RANK=rank, ROPE=rope, BLOCK_R=block_r, BLOCK_P=block_p,
        BLOCK_H=BLOCK_H, BLOCK_N=DECODE_BLOCK_N,
        NUM_SPLITS=num_splits, num_warps=4, num_stages=2,
    )
    # The merge is the dense kernel's: it only needs each chunk's bounds, which BLOCK_N and
    # seq_lens decide the same way here.
    _STAGE2.launch(
        (bs, num_heads), mid_out, mid_lse, out, seq_lens,
        mid_out.stride(0), mid_out.stride(1), mid_out.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1),
        HEAD_DIM=rank, BLOCK_D=block_r, BLOCK_N=DECODE_BLOCK_N, NUM_SPLITS=num_splits,
        num_warps=4, num_stages=1,
    )


def mla_extend_attention(
    q: torch.Tensor,  # [num_tokens, heads, rank + rope]
    latent_cache: torch.Tensor,  # [num_slots, 1, rank + rope], new tokens already stored
    out: torch.Tensor,  # [num_tokens, heads, rank], written in place
    req_to_token: torch.Tensor,  # [max_reqs, max_context_len] int32
    req_pool_indices: torch.Tensor,  # [bs]
    extend_prefix_lens: torch.Tensor,  # [bs] int32
    extend_seq_lens: torch.Tensor,  # [bs] int32
    extend_start_loc: torch.Tensor,  # [bs] int32
    sm_scale: float,
    max_extend_len: int,
    num_real_tokens: int,
) -> None:
    """Causal attention of each request's new tokens over its prefix and themselves; rows
    from `num_real_tokens` on (a replayed piecewise graph's padding) are written as zeros."""
    _, num_heads, _ = q.shape
    rank = out.shape[-1]
    rope = _check_layout(q, latent_cache, out, rank)
    bs = req_pool_indices.shape[0]
    assert req_to_token.stride(1) == 1
    out[num_real_tokens:].zero_()
    if bs == 0 or max_extend_len == 0:
        return
    block_r, block_p = _part_blocks(rank, rope)
    # Heads vary fastest: the programs of one query block read the same latent rows from L2.
    _MLA_EXTEND.launch(
        (num_heads, bs, triton.cdiv(max_extend_len, EXTEND_BLOCK_M)), q, latent_cache, out,
        req_to_token, req_pool_indices, extend_prefix_lens, extend_seq_lens, extend_start_loc,
        sm_scale * LOG2_E,
        q.stride(0), q.stride(1), latent_cache.stride(0), out.stride(0), out.stride(1),
        req_to_token.stride(0),
        RANK=rank, ROPE=rope, BLOCK_R=block_r, BLOCK_P=block_p, BLOCK_M=EXTEND_BLOCK_M,
        BLOCK_N=EXTEND_BLOCK_N, num_warps=EXTEND_WARPS, num_stages=2,
    )
