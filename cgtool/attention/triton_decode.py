"""Split-KV decode attention (flash-decoding) over the token-granular KV pool.

Stage 1 splits each request's keys into `num_kv_splits` chunks (a number fixed by the
batch size) and lets one program
attend the whole GQA group of q heads of one KV head over one chunk, so each K/V row is
read once per group and the scores come from one tensor-core dot. Stage 2 merges the
chunks by their log-sum-exp. The grid depends only on the batch size and the shapes and
the chunk bounds are computed in the kernel from `seq_lens`, so a CUDA graph captured
at one batch size replays correctly for any sequence lengths.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cgtool.attention.triton_softmax import online_softmax_step
from cgtool.triton_launch import CachedKernel

# Scores are computed in base 2: exp2 is a single MUFU instruction, exp is not.
LOG2_E = 1.4426950408889634
# tl.dot needs at least 16 rows; smaller GQA groups are padded with masked rows.
MIN_BLOCK_H = 16


# Chunks per request: enough programs to keep an H100's 132 SMs busy several times over.
# On the H100 sweep (scripts/bench_attention.py --sweep, 32/8 heads, head_dim 128) a 32k-token
# decode at batch size 1 ran in 57 us with 64 chunks against 143 us with 16, while from batch
# size 8 on more chunks only add partial results to write and merge.
TARGET_PROGRAMS = 1024
MIN_KV_SPLITS, MAX_KV_SPLITS = 16, 64


def num_kv_splits_for(batch_size: int, kv_heads: int) -> int:
    """A power of two fixed by the batch size, so a captured graph's grid stays valid."""
    wanted = triton.next_power_of_2(triton.cdiv(TARGET_PROGRAMS, batch_size * kv_heads))
    return max(MIN_KV_SPLITS, min(MAX_KV_SPLITS, wanted))


def launch_config() -> tuple[int, int, int]:
    """(BLOCK_N, num_warps, num_stages) of stage 1: SGLang's grouped decode kernel's, and the
    best of the H100 sweep at batch size 64.

    Chunks are whole multiples of BLOCK_N, so short sequences use fewer chunks instead of
    spreading a handful of keys thinly over all of them.
    """
    return 32, 4, 2


@triton.jit
def _decode_stage1(
    Q, K, V, MidOut, MidLse, req_to_token, req_pool_indices, seq_lens, scale_log2,
    stride_qb, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_req,
    stride_mb, stride_mh, stride_ms, stride_lb, stride_lh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    seq_len = tl.load(seq_lens + b)
    split_len = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    split_start = split * split_len
    split_end = tl.minimum(split_start + split_len, seq_len)
    if split_end <= split_start:
        return  # stage 2 skips empty chunks, so nothing needs writing

    offs_h = tl.arange(0, BLOCK_H)
    heads = kv_head * GROUP + offs_h
    mask_h = offs_h < GROUP
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    q = tl.load(
        Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
        mask=mask_h[:, None] & mask_d[None, :], other=0.0,
    )
    token_row = req_to_token + tl.load(req_pool_indices + b).to(tl.int64) * stride_req

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for start_n in range(split_start, split_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        mask_n = offs_n < split_end
        # int64: slot * stride overflows int32 on pools of a few million tokens.
        slots = tl.load(token_row + offs_n, mask=mask_n, other=0).to(tl.int64)
        k = tl.load(
            K + slots[None, :] * stride_kt + kv_head * stride_kh + offs_d[:, None],
            mask=mask_n[None, :] & mask_d[:, None], other=0.0,
        )  # [BLOCK_D, BLOCK_N]
        s = tl.dot(q, k.to(q.dtype)) * scale_log2
        s = tl.where(mask_n[None, :], s, float("-inf"))
        v = tl.load(
            V + slots[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :],
            mask=mask_n[:, None] & mask_d[None, :], other=0.0,
        )  # [BLOCK_N, BLOCK_D]
        acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, s, v)

    tl.store(
        MidOut + b * stride_mb + heads[:, None] * stride_mh + split * stride_ms + offs_d[None, :],
        acc / l_i[:, None], mask=mask_h[:, None] & mask_d[None, :],
    )
    tl.store(MidLse + b * stride_lb + heads * stride_lh + split, m_i + tl.log2(l_i), mask=mask_h)


@triton.jit
def _decode_stage2(
    MidOut, MidLse, O, seq_lens,
    stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
):
    b = tl.program_id(0)
    head = tl.program_id(1)
    seq_len = tl.load(seq_lens + b)
    split_len = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    offs_s = tl.arange(0, NUM_SPLITS)
    used = offs_s * split_len < seq_len  # chunks stage 1 skipped hold garbage
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM

    lse = tl.load(MidLse + b * stride_lb + head * stride_lh + offs_s, mask=used, other=float("-inf"))
    parts = tl.load(
        MidOut + b * stride_mb + head * stride_mh + offs_s[:, None] * stride_ms + offs_d[None, :],
        mask=used[:, None] & mask_d[None, :], other=0.0,
    )  # [NUM_SPLITS, BLOCK_D]
    lse_max = tl.max(lse, 0)
    weights = tl.where(used, tl.exp2(lse - lse_max), 0.0)
    total = tl.sum(weights, 0)
    merged = tl.sum(parts * weights[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(O + b * stride_ob + head * stride_oh + offs_d, merged.to(O.dtype.element_ty), mask=mask_d)


_STAGE1 = CachedKernel(_decode_stage1)
_STAGE2 = CachedKernel(_decode_stage2)


def decode_scratch(
    batch_size: int, num_heads: int, head_dim: int, num_kv_splits: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 partial outputs and log-sum-exps of every chunk, for `decode_attention`."""
    mid_out = torch.empty(
        (batch_size, num_heads, num_kv_splits, head_dim), dtype=torch.float32, device=device
    )  # [bs, heads, num_kv_splits, head_dim]
    mid_lse = torch.empty(
        (batch_size, num_heads, num_kv_splits), dtype=torch.float32, device=device
    )  # [bs, heads, num_kv_splits], base-2 log-sum-exp
    return mid_out, mid_lse


def decode_attention(
    q: torch.Tensor,  # [bs, heads, head_dim]
    k_cache: torch.Tensor,  # [num_slots, kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_slots, kv_heads, head_dim]
    out: torch.Tensor,  # [bs, heads, head_dim], written in place
    req_to_token: torch.Tensor,  # [max_reqs, max_context_len] int32
    req_pool_indices: torch.Tensor,  # [bs]
    seq_lens: torch.Tensor,  # [bs] int32, including the new token
    sm_scale: float,
    mid_out: torch.Tensor,  # [bs, heads, num_kv_splits, head_dim] fp32 scratch
    mid_lse: torch.Tensor,  # [bs, heads, num_kv_splits] fp32 scratch
) -> None:
    """One query per request over keys 0..seq_lens[b]-1; no host synchronisation."""
    bs, num_heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    group = num_heads // kv_heads
    num_splits = mid_out.shape[2]
    assert num_splits & (num_splits - 1) == 0, "num_kv_splits must be a power of two"
    assert q.stride(2) == k_cache.stride(2) == v_cache.stride(2) == out.stride(2) == 1
    assert req_to_token.stride(1) == 1
    block_d = triton.next_power_of_2(head_dim)
    block_n, num_warps, num_stages = launch_config()
    _STAGE1.launch(
        (bs, kv_heads, num_splits), q, k_cache, v_cache, mid_out, mid_lse, req_to_token, req_pool_indices, seq_lens,
        sm_scale * LOG2_E,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1), req_to_token.stride(0),
        mid_out.stride(0), mid_out.stride(1), mid_out.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_D=block_d,
        BLOCK_H=max(MIN_BLOCK_H, triton.next_power_of_2(group)), BLOCK_N=block_n,
        NUM_SPLITS=num_splits, num_warps=num_warps, num_stages=num_stages,
    )
    _STAGE2.launch(
        (bs, num_heads), mid_out, mid_lse, out, seq_lens,
        mid_out.stride(0), mid_out.stride(1), mid_out.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_N=block_n, NUM_SPLITS=num_splits,
        num_warps=4, num_stages=1,
    )
