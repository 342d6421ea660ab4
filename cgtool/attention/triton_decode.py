"""Split-KV decode attention (flash-decoding) over the token-granular KV pool.

Stage 1 splits each request's keys into `num_kv_splits` chunks (a number fixed by the
batch size) and lets one program attend the whole GQA group of q heads of one KV head over
one chunk, so each K/V row is read once per group and the scores come from one tensor-core
dot. Stage 2 merges the chunks by their log-sum-exp. The grid depends only on the batch size
and the shapes and the chunk bounds are computed in the kernel from `seq_lens`, so a CUDA
graph captured at one batch size replays correctly for any sequence lengths.

A merge folded into stage 1 (the last program of a request and KV head to arrive merging
them all) saved an eager step 32 launches but cost the GPU 4.3 µs a call at batch size 1 and
a third more at 64 (H100, benchmarks r11): the merging program works alone, head by head.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from cgtool.attention.triton_keys import BEFORE_END, attend_key_block
from cgtool.attention.triton_softmax import LOG2_E, online_softmax_init
from cgtool.runtime.triton_launch import CachedKernel, cdiv, next_power_of_2

# tl.dot needs at least 16 rows; smaller GQA groups are padded with masked rows.
MIN_BLOCK_H = 16


# Chunks per request: enough programs to keep an H100's 132 SMs busy several times over.
# On the H100 sweep (benchmarks/bench_attention.py --sweep, 32/8 heads, head_dim 128) a 32k-token
# decode at batch size 1 ran in 57 us with 64 chunks against 143 us with 16, while from batch
# size 8 on more chunks only add partial results to write and merge.
TARGET_PROGRAMS = 1024
MIN_KV_SPLITS, MAX_KV_SPLITS = 16, 64
MERGE_LANES = tl.constexpr(MAX_KV_SPLITS)


def num_kv_splits_for(batch_size: int, kv_heads: int) -> int:
    """A power of two fixed by the batch size, so a captured graph's grid stays valid."""
    wanted = next_power_of_2(cdiv(TARGET_PROGRAMS, batch_size * kv_heads))
    return max(MIN_KV_SPLITS, min(MAX_KV_SPLITS, wanted))


def launch_config() -> tuple[int, int, int]:
    """(BLOCK_N, num_warps, num_stages) of stage 1: SGLang's grouped decode kernel's, and the
    best of the H100 sweep at batch size 64.

    Chunks are whole multiples of BLOCK_N, so short sequences use fewer chunks instead of
    spreading a handful of keys thinly over all of them.
    """
    return 32, 4, 2


@triton.jit
def split_len(seq_len, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """Keys per chunk: whole BLOCK_N multiples, so a short request fills fewer chunks."""
    return tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N


@triton.jit
def split_bounds(seq_lens, b, split, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """(start, end) of request b's keys in chunk `split`; empty when the request is shorter."""
    seq_len = tl.load(seq_lens + b)
    keys = split_len(seq_len, NUM_SPLITS, BLOCK_N)
    split_start = split * keys
    return split_start, tl.minimum(split_start + keys, seq_len)


@triton.jit
def store_split(
    MidOut, MidLse, acc, l_i, m_i, b, heads, split, offs_d, mask_h, mask_d,
    stride_mb, stride_mh, stride_ms, stride_lb, stride_lh,
):
    """One chunk's normalised output and base-2 log-sum-exp, for stage 2 to merge."""
    tl.store(
        MidOut + b * stride_mb + heads[:, None] * stride_mh + split * stride_ms + offs_d[None, :],
        acc / l_i[:, None], mask=mask_h[:, None] & mask_d[None, :],
    )
    tl.store(MidLse + b * stride_lb + heads * stride_lh + split, m_i + tl.log2(l_i), mask=mask_h)


@triton.jit
def _decode_stage1(
    Q, K, V, MidOut, MidLse, req_to_token, req_pool_indices, seq_lens, scale_log2, stride_req,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
):
    # Every tensor but req_to_token is contiguous, so its strides follow from the grid and
    # the constexprs: fewer arguments are less host time at each launch.
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_heads = tl.num_programs(1) * GROUP
    stride_qb, stride_qh = num_heads * HEAD_DIM, HEAD_DIM  # q: [bs, heads, head_dim]
    stride_kt, stride_kh = tl.num_programs(1) * HEAD_DIM, HEAD_DIM  # [slots, kv_heads, head_dim]
    stride_ms, stride_mh = HEAD_DIM, NUM_SPLITS * HEAD_DIM  # [bs, heads, splits, head_dim]
    stride_lh = NUM_SPLITS  # [bs, heads, splits]
    split_start, split_end = split_bounds(seq_lens, b, split, NUM_SPLITS, BLOCK_N)
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

    acc, l_i, m_i = online_softmax_init(BLOCK_H, BLOCK_D)
    for start_n in range(split_start, split_end, BLOCK_N):
        acc, l_i, m_i = attend_key_block(
            acc, l_i, m_i, q, 0, K, V, token_row, start_n, split_end, kv_head, scale_log2,
            stride_kt, stride_kh, stride_kt, stride_kh, offs_d, mask_d, BLOCK_N, BEFORE_END,
        )
    store_split(
        MidOut, MidLse, acc, l_i, m_i, b, heads, split, offs_d, mask_h, mask_d,
        num_heads * stride_mh, stride_mh, stride_ms, num_heads * stride_lh, stride_lh,
    )


@triton.jit
def merge_head(
    MidOut, MidLse, O, b, head, seq_len,
    stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
    d_start=0,
):
    """One head's output from its chunks, weighted by their log-sum-exps.

    The sums run over MERGE_LANES lanes whatever the split count, so the same chunks add up
    in the same order: a batch padded to a captured size (and a split count of its own)
    reads the same bits as at its own size, where a split-count-wide sum differed by an ulp."""
    offs_s = tl.arange(0, MERGE_LANES)
    used = offs_s * split_len(seq_len, NUM_SPLITS, BLOCK_N) < seq_len  # stage 1 skipped the rest
    offs_d = d_start + tl.arange(0, BLOCK_D)  # MLA's 512-wide heads merge in slices
    mask_d = offs_d < HEAD_DIM
    lse_ptrs = MidLse + b * stride_lb + head * stride_lh + offs_s
    part_ptrs = MidOut + b * stride_mb + head * stride_mh + offs_s[:, None] * stride_ms + offs_d[None, :]
    part_mask = used[:, None] & mask_d[None, :]
    lse = tl.load(lse_ptrs, mask=used, other=float("-inf"))
    parts = tl.load(part_ptrs, mask=part_mask, other=0.0)  # [MERGE_LANES, BLOCK_D]
    lse_max = tl.max(lse, 0)
    weights = tl.where(used, tl.exp2(lse - lse_max), 0.0)
    total = tl.sum(weights, 0)
    merged = tl.sum(parts * weights[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(O + b * stride_ob + head * stride_oh + offs_d, merged.to(O.dtype.element_ty), mask=mask_d)


@triton.jit
def _decode_stage2(
    MidOut, MidLse, O, seq_lens,
    stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
):
    b = tl.program_id(0)
    head = tl.program_id(1)
    merge_head(
        MidOut, MidLse, O, b, head, tl.load(seq_lens + b),
        stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ob, stride_oh,
        HEAD_DIM, BLOCK_D, BLOCK_N, NUM_SPLITS,
    )


_STAGE1 = CachedKernel(_decode_stage1)
_STAGE2 = CachedKernel(_decode_stage2)


def decode_scratch(
    batch_size: int, num_heads: int, width: int, num_kv_splits: int, device: torch.device,
    shared: dict[object, Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 partial outputs and log-sum-exps of every chunk.

    From `shared` (a forward's workspace, `batch.forward_scratch()`) where it already holds
    a block of this shape: the layers run one after the other, so one block serves them
    all. Inside a capture it comes from the graph pool.
    """
    # Stage 2 spans a request's chunks with one tl.arange, whose length is a power of two.
    assert num_kv_splits & (num_kv_splits - 1) == 0, "num_kv_splits must be a power of two"
    assert num_kv_splits <= MAX_KV_SPLITS, "the merge spans at most MAX_KV_SPLITS chunks"
    key = ("decode_scratch", batch_size, num_heads, width, num_kv_splits, device)
    found = shared.get(key) if shared is not None else None
    if found is not None:
        return found
    mid_out = torch.empty(
        (batch_size, num_heads, num_kv_splits, width), dtype=torch.float32, device=device
    )  # [bs, heads, num_kv_splits, width]
    mid_lse = torch.empty(
        (batch_size, num_heads, num_kv_splits), dtype=torch.float32, device=device
    )  # [bs, heads, num_kv_splits], base-2 log-sum-exp
    if shared is not None:
        shared[key] = (mid_out, mid_lse)
    return mid_out, mid_lse


def merge_splits(
    mid_out: torch.Tensor, mid_lse: torch.Tensor, out: torch.Tensor, seq_lens: torch.Tensor,
    block_d: int, block_n: int,
) -> None:
    """Stage 2: each head's output from its chunks, weighted by their log-sum-exps.

    It needs only each chunk's bounds, which `block_n` (stage 1's) and seq_lens decide."""
    _STAGE2.launch(
        (out.shape[0], out.shape[1]), mid_out, mid_lse, out, seq_lens,
        mid_out.stride(0), mid_out.stride(1), mid_out.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1),
        HEAD_DIM=mid_out.shape[3], BLOCK_D=block_d, BLOCK_N=block_n, NUM_SPLITS=mid_out.shape[2],
        num_warps=4, num_stages=1,
    )


def decode_attention(
    q: torch.Tensor,  # [bs, heads, head_dim]
    k_cache: torch.Tensor, v_cache: torch.Tensor,  # [num_slots, kv_heads, head_dim] each
    out: torch.Tensor,  # [bs, heads, head_dim], written in place
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
    sm_scale: float, num_kv_splits: int, scratch: dict[object, Any] | None = None,
) -> None:
    """One query per request over keys 0..seq_lens[b]-1 (the new token included), split
    into `num_kv_splits` chunks, a power of two; no host synchronisation. `scratch`: see
    `decode_scratch`."""
    bs, num_heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    assert q.is_contiguous() and k_cache.is_contiguous() and v_cache.is_contiguous()
    assert out.stride(2) == 1
    assert req_to_token.stride(1) == 1
    mid_out, mid_lse = decode_scratch(bs, num_heads, head_dim, num_kv_splits, q.device, scratch)
    block_n, num_warps, num_stages = launch_config()
    group, block_d = num_heads // kv_heads, next_power_of_2(head_dim)
    _STAGE1.launch(
        (bs, kv_heads, num_kv_splits), q, k_cache, v_cache, mid_out, mid_lse, req_to_token,
        req_pool_indices, seq_lens, sm_scale * LOG2_E, req_to_token.stride(0),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_D=block_d,
        BLOCK_H=max(MIN_BLOCK_H, next_power_of_2(group)), BLOCK_N=block_n,
        NUM_SPLITS=num_kv_splits, num_warps=num_warps, num_stages=num_stages,
    )
    merge_splits(mid_out, mid_lse, out, seq_lens, block_d, block_n)
