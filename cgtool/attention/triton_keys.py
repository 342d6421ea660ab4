"""One block of a request's keys, read through req_to_token by the Triton kernels.

Decode and extend attend the dense pool the same way: gather the block's slots, load its
K and V, score, mask and take one online-softmax step. Only the mask differs, and it is a
constexpr, so each kernel compiles just its own case.
"""

from __future__ import annotations

import triton
import triton.language as tl

from cgtool.attention.triton_softmax import online_softmax_step

# How a block's scores are masked.
ALL_VISIBLE = tl.constexpr(0)  # every key of the block is in range and visible to every query
BEFORE_END = tl.constexpr(1)  # keys at or past kv_end are masked
CAUSAL = tl.constexpr(2)  # so are keys past the query's own position, q_pos


@triton.jit
def block_slots(token_row, offs_n, mask_n):
    """The pool slots of keys `offs_n` of the request whose req_to_token row is `token_row`."""
    # int64: slot * stride overflows int32 on pools of a few million tokens.
    return tl.load(token_row + offs_n, mask=mask_n, other=0).to(tl.int64)


@triton.jit
def attend_key_block(
    acc, l_i, m_i, q, q_pos, K, V, token_row, start_n, kv_end, kv_head, scale_log2,
    stride_kt, stride_kh, stride_vt, stride_vh, offs_d, mask_d,
    BLOCK_N: tl.constexpr, MASK: tl.constexpr,
):
    """One online-softmax step over keys start_n..start_n + BLOCK_N - 1 of one KV head."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    mask_n = offs_n < kv_end
    slots = block_slots(token_row, offs_n, mask_n)
    k = tl.load(
        K + slots[None, :] * stride_kt + kv_head * stride_kh + offs_d[:, None],
        mask=mask_n[None, :] & mask_d[:, None], other=0.0,
    )  # [BLOCK_D, BLOCK_N]
    s = tl.dot(q, k.to(q.dtype)) * scale_log2
    if MASK == BEFORE_END:
        s = tl.where(mask_n[None, :], s, float("-inf"))
    elif MASK == CAUSAL:
        # Key 0 is visible to every query, so no row is ever fully masked (no NaN).
        s = tl.where(mask_n[None, :] & (offs_n[None, :] <= q_pos[:, None]), s, float("-inf"))
    v = tl.load(
        V + slots[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :],
        mask=mask_n[:, None] & mask_d[None, :], other=0.0,
    )  # [BLOCK_N, BLOCK_D]
    return online_softmax_step(acc, l_i, m_i, s, v)
