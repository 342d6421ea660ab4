"""Varlen causal extend attention over the token-granular KV pool.

The attention op stores the new tokens' K/V in the pool before the backend runs, so
every key, cached prefix and new token alike, is read through req_to_token: query j of
request b sits at position prefix_lens[b] + j and sees the keys at positions up to its
own. One program handles BLOCK_M queries of one request and one q head.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cgtool.attention.triton_keys import ALL_VISIBLE, CAUSAL, attend_key_block
from cgtool.attention.triton_softmax import LOG2_E, online_softmax_init
from cgtool.runtime.triton_launch import CachedKernel, cdiv, next_power_of_2


def launch_config(head_dim: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages).

    SGLang's 128 x 64 tile; 4 warps and 2 stages rather than its 8 and 1 ran 1.3x faster
    on the H100 sweep (benchmarks/bench_attention.py --sweep: 2048 causal tokens, 32/8 heads,
    head_dim 128, 128 us against 168 us).
    """
    del head_dim  # one tile serves head_dim 64 and 128
    return 128, 64, 4, 2


@triton.jit
def _extend_kernel(
    Q, K, V, O, req_to_token, req_pool_indices, prefix_lens, extend_lens, start_loc, scale_log2,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    stride_req,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    head = tl.program_id(0)
    b = tl.program_id(1)
    # Causal blocks further down a request see more keys: launch those first, so the
    # light ones fill the tail of the wave.
    block_m = tl.num_programs(2) - 1 - tl.program_id(2)
    extend_len = tl.load(extend_lens + b)
    if block_m * BLOCK_M >= extend_len:
        return  # the grid is sized for the longest request of the batch

    kv_head = head // GROUP
    prefix = tl.load(prefix_lens + b)
    first_token = tl.load(start_loc + b)
    token_row = req_to_token + tl.load(req_pool_indices + b).to(tl.int64) * stride_req
    offs_m = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < extend_len
    q_pos = prefix + offs_m
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    rows = (first_token + offs_m).to(tl.int64)
    q = tl.load(
        Q + rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :],
        mask=mask_m[:, None] & mask_d[None, :], other=0.0,
    )  # [BLOCK_M, BLOCK_D]

    acc, l_i, m_i = online_softmax_init(BLOCK_M, BLOCK_D)
    # Whole key blocks before the block's first query are visible to all its queries; the
    # rest, up to the last query's own position, need the causal mask.
    unmasked_end = (prefix + block_m * BLOCK_M) // BLOCK_N * BLOCK_N
    kv_end = prefix + tl.minimum(extend_len, (block_m + 1) * BLOCK_M)
    for start_n in range(0, unmasked_end, BLOCK_N):
        acc, l_i, m_i = attend_key_block(
            acc, l_i, m_i, q, q_pos, K, V, token_row, start_n, kv_end, kv_head, scale_log2,
            stride_kt, stride_kh, stride_vt, stride_vh, offs_d, mask_d, BLOCK_N, ALL_VISIBLE,
        )
    for start_n in range(unmasked_end, kv_end, BLOCK_N):
        acc, l_i, m_i = attend_key_block(
            acc, l_i, m_i, q, q_pos, K, V, token_row, start_n, kv_end, kv_head, scale_log2,
            stride_kt, stride_kh, stride_vt, stride_vh, offs_d, mask_d, BLOCK_N, CAUSAL,
        )

    tl.store(
        O + rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :],
        (acc / l_i[:, None]).to(O.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :],
    )


_EXTEND = CachedKernel(_extend_kernel)


def extend_attention(
    q: torch.Tensor,  # [num_tokens, heads, head_dim]
    k_cache: torch.Tensor, v_cache: torch.Tensor,  # [num_slots, kv_heads, head_dim], new tokens stored
    out: torch.Tensor,  # [num_tokens, heads, head_dim], written in place
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
    extend_prefix_lens: torch.Tensor, extend_seq_lens: torch.Tensor, extend_start_loc: torch.Tensor,
    sm_scale: float, max_extend_len: int,
) -> None:
    """Causal attention of each request's new tokens over its prefix and themselves.

    `max_extend_len` (at least 1) bounds the grid; rows past the real tokens are left alone."""
    _, num_heads, head_dim = q.shape
    group = num_heads // k_cache.shape[1]
    assert q.stride(2) == k_cache.stride(2) == v_cache.stride(2) == out.stride(2) == 1
    assert req_to_token.stride(1) == 1
    block_m, block_n, num_warps, num_stages = launch_config(head_dim)
    # Heads vary fastest so the q heads of one GQA group read the same K/V from L2.
    _EXTEND.launch(
        (num_heads, req_pool_indices.shape[0], cdiv(max_extend_len, block_m)), q, k_cache,
        v_cache, out, req_to_token, req_pool_indices,
        extend_prefix_lens, extend_seq_lens, extend_start_loc, sm_scale * LOG2_E,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1), out.stride(0), out.stride(1), req_to_token.stride(0),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_D=next_power_of_2(head_dim),
        BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps, num_stages=num_stages,
    )
