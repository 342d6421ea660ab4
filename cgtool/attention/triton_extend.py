"""Varlen causal extend attention over the token-granular KV pool.

The attention op stores the new tokens' K/V in the pool before the backend runs, so
every key, cached prefix and new token alike, is read through req_to_token: query j of
request b sits at position prefix_lens[b] + j and sees the keys at positions up to its
own. One program handles BLOCK_M query rows of one request: one q head's BLOCK_M queries, or
for a step of few new tokens (`extend_heads`) HEADS q heads of one GQA group for each of
BLOCK_M / HEADS queries, so the group's heads read their keys once, not once each.

A step of a few new tokens over a long cached prefix gives only heads x requests x query
blocks programs, each reading the whole prefix alone: 14 new tokens over a 24,576-token prefix
took 1 ms a layer where its KV reads in 17 us (qwen3-30b-a3b's shape, H100,
benchmarks/bench_extend_split.py; a Mooncake verify step of that shape, 73.7 ms). Such
a step splits the keys each program sees into `kv_splits` chunks, all visible to every query
except the last one's causal tail; each chunk's program writes its partial output and
log-sum-exp, and a second kernel merges them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cgtool.attention.triton_keys import ALL_VISIBLE, CAUSAL, attend_key_block
from cgtool.attention.triton_softmax import LOG2_E, online_softmax_init
from cgtool.runtime.triton_launch import CachedKernel, cdiv, next_power_of_2

# Splits are asked for when a step's programs fill fewer than this many waves of the SMs, and
# given at least MIN_SPLIT_KEYS keys each (a chunk's partial costs a write and a merge), or
# HEADS_MIN_SPLIT_KEYS where a program's rows are heads of few tokens: its partial is a few
# rows, where a 128-row block's is 128.
SPLIT_BELOW_WAVES = 1
MIN_SPLIT_KEYS = 1024
HEADS_MIN_SPLIT_KEYS = 256
MAX_KV_SPLITS = 64
# Steps whose requests add at most this many tokens get query blocks of their size.
SMALL_EXTEND = 64


def launch_config(head_dim: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages); a step of at most SMALL_EXTEND new tokens a
    request takes smaller query blocks (`extend_launch`).

    SGLang's 128 x 64 tile; 4 warps and 2 stages rather than its 8 and 1 ran 1.3x faster
    on the H100 sweep (benchmarks/bench_attention.py --sweep: 2048 causal tokens, 32/8 heads,
    head_dim 128, 128 us against 168 us). A 128-row block did 128 rows' work for one new token.
    """
    del head_dim  # one tile serves head_dim 64 and 128
    return 128, 64, 4, 2


def small_block_m(rows: int) -> int:
    """A small step's query block: its rows rounded up to a power of two, 16 (tl.dot's least)
    to SMALL_EXTEND."""
    return min(SMALL_EXTEND, max(16, next_power_of_2(rows)))


def extend_heads(num_heads: int, group: int, max_extend_len: int) -> int:
    """q heads a program takes as rows: 1 past SMALL_EXTEND new tokens a request, where a
    block of one head's queries is full; below, the most heads of one GQA group (a power of
    two dividing `group`) whose rows fit a SMALL_EXTEND block, so the keys every head of
    the group sees are read once a block."""
    if max_extend_len > SMALL_EXTEND or num_heads % group:
        return 1
    heads = group & -group  # the largest power of two dividing the group
    return min(heads, SMALL_EXTEND)


@triton.jit
def query_rows(block_m, head_block, BLOCK_M: tl.constexpr, HEADS: tl.constexpr):
    """(token within the request, q head) of each of a program's BLOCK_M rows: HEADS heads of
    each of BLOCK_M // HEADS tokens, heads fastest."""
    offs = tl.arange(0, BLOCK_M)
    return block_m * (BLOCK_M // HEADS) + offs // HEADS, head_block * HEADS + offs % HEADS


@triton.jit
def block_and_split(num_splits, SPLIT: tl.constexpr):
    """(query block, key split) of this program. Causal blocks further down a request see more
    keys: those launch first, so the light ones fill the tail of the wave. The split count is
    a runtime value, so each step's count does not compile a kernel of its own."""
    if SPLIT:
        return tl.num_programs(2) // num_splits - 1 - tl.program_id(2) // num_splits, tl.program_id(2) % num_splits
    return tl.num_programs(2) - 1 - tl.program_id(2), 0


@triton.jit
def split_keys(unmasked_end, split, num_splits, SPLIT: tl.constexpr, BLOCK_N: tl.constexpr):
    """(start, end) of split `split`'s share of the keys every query of a block sees, in whole
    BLOCK_N blocks. The last split also takes the causal tail after them, so every split but
    the last is visible to all its queries and no query of a split sees no key at all."""
    if not SPLIT:
        return 0, unmasked_end
    chunk = tl.cdiv(tl.cdiv(unmasked_end, num_splits), BLOCK_N) * BLOCK_N
    lo = tl.minimum(split * chunk, unmasked_end)
    return lo, tl.minimum(lo + chunk, unmasked_end)


@triton.jit
def store_split_partial(MidO, MidLse, acc, l_i, m_i, rows, head, split, offs_d, mask_m, mask_d,
                        stride_mt, stride_mh, stride_lt, stride_lh, WIDTH: tl.constexpr):
    """A split's normalised output and base-2 log-sum-exp per query row (token `rows`, q head
    `head`, one per row); a split without keys (a short prefix) leaves zeros and -inf."""
    seen = l_i > 0
    tl.store(MidO + (rows * stride_mt + head * stride_mh)[:, None] + split * WIDTH + offs_d[None, :],
             tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0),
             mask=mask_m[:, None] & mask_d[None, :])
    tl.store(MidLse + rows * stride_lt + head * stride_lh + split,
             tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf")), mask=mask_m)


@triton.jit
def _extend_kernel(
    Q, K, V, O, MidO, MidLse, req_to_token, req_pool_indices, prefix_lens, extend_lens, start_loc,
    scale_log2,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    stride_req, stride_mt, stride_mh, stride_lt, stride_lh, num_splits,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, HEADS: tl.constexpr,
):
    head_block = tl.program_id(0)
    b = tl.program_id(1)
    block_m, split = block_and_split(num_splits, SPLIT)
    extend_len = tl.load(extend_lens + b)
    tokens = BLOCK_M // HEADS  # a block's queries
    if block_m * tokens >= extend_len:
        return  # the grid is sized for the longest request of the batch

    kv_head = head_block * HEADS // GROUP  # HEADS divides GROUP: one KV head a program
    prefix = tl.load(prefix_lens + b)
    first_token = tl.load(start_loc + b)
    token_row = req_to_token + tl.load(req_pool_indices + b).to(tl.int64) * stride_req
    offs_m, head = query_rows(block_m, head_block, BLOCK_M, HEADS)
    mask_m = offs_m < extend_len
    q_pos = prefix + offs_m
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    rows = (first_token + offs_m).to(tl.int64)
    q = tl.load(
        Q + (rows * stride_qt + head * stride_qh)[:, None] + offs_d[None, :],
        mask=mask_m[:, None] & mask_d[None, :], other=0.0,
    )  # [BLOCK_M, BLOCK_D]

    acc, l_i, m_i = online_softmax_init(BLOCK_M, BLOCK_D)
    # Whole key blocks before the block's first query are visible to all its queries; the
    # rest, up to the last query's own position, need the causal mask.
    unmasked_end = (prefix + block_m * tokens) // BLOCK_N * BLOCK_N
    kv_end = prefix + tl.minimum(extend_len, (block_m + 1) * tokens)
    lo, visible_end = split_keys(unmasked_end, split, num_splits, SPLIT, BLOCK_N)
    for start_n in range(lo, visible_end, BLOCK_N):
        acc, l_i, m_i = attend_key_block(
            acc, l_i, m_i, q, q_pos, K, V, token_row, start_n, kv_end, kv_head, scale_log2,
            stride_kt, stride_kh, stride_vt, stride_vh, offs_d, mask_d, BLOCK_N, ALL_VISIBLE,
        )
    causal_end = kv_end
    if SPLIT:
        causal_end = tl.where(split == num_splits - 1, kv_end, unmasked_end)  # the tail: the last split's
    for start_n in range(unmasked_end, causal_end, BLOCK_N):
        acc, l_i, m_i = attend_key_block(
            acc, l_i, m_i, q, q_pos, K, V, token_row, start_n, kv_end, kv_head, scale_log2,
            stride_kt, stride_kh, stride_vt, stride_vh, offs_d, mask_d, BLOCK_N, CAUSAL,
        )

    if SPLIT:
        store_split_partial(MidO, MidLse, acc, l_i, m_i, rows, head, split, offs_d, mask_m, mask_d,
                            stride_mt, stride_mh, stride_lt, stride_lh, BLOCK_D)
    else:
        tl.store(O + (rows * stride_ot + head * stride_oh)[:, None] + offs_d[None, :],
                 (acc / l_i[:, None]).to(O.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])


@triton.jit
def _extend_merge_kernel(
    MidO, MidLse, O, stride_mt, stride_mh, stride_lt, stride_lh, stride_ot, stride_oh, num_splits,
    HEAD_DIM: tl.constexpr, SPLIT_STRIDE: tl.constexpr, SLICE_D: tl.constexpr, SPLITS_P2: tl.constexpr,
):
    """A slice of one token's head from its key chunks, weighted by their log-sum-exps."""
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_P2)
    offs_d = tl.program_id(2) * SLICE_D + tl.arange(0, SLICE_D)
    used = offs_s < num_splits
    mask_d = offs_d < HEAD_DIM
    lse = tl.load(MidLse + row * stride_lt + head * stride_lh + offs_s, mask=used, other=float("-inf"))
    parts = tl.load(MidO + row * stride_mt + head * stride_mh + offs_s[:, None] * SPLIT_STRIDE + offs_d[None, :],
                    mask=used[:, None] & mask_d[None, :], other=0.0)
    weights = tl.exp2(lse - tl.max(lse, 0))  # the last chunk always holds keys: the max is finite
    merged = tl.sum(parts * weights[:, None], 0) / tl.sum(weights, 0)
    tl.store(O + row * stride_ot + head * stride_oh + offs_d, merged.to(O.dtype.element_ty), mask=mask_d)


_EXTEND = CachedKernel(_extend_kernel)
_MERGE = CachedKernel(_extend_merge_kernel)


def split_scratch(num_tokens: int, num_heads: int, width: int, kv_splits: int, device: torch.device
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 partial outputs [tokens, heads, splits x width] and log-sum-exps [tokens, heads, splits]."""
    return (torch.empty((num_tokens, num_heads, kv_splits * width), dtype=torch.float32, device=device),
            torch.empty((num_tokens, num_heads, kv_splits), dtype=torch.float32, device=device))


def merge_splits(mid_o: torch.Tensor, mid_lse: torch.Tensor, out: torch.Tensor, new_tokens: int,
                 head_dim: int, width: int, kv_splits: int) -> None:
    """`out`'s first `new_tokens` rows from their key chunks (128-column slices a program)."""
    slice_d = min(128, width)
    _MERGE.launch(
        (new_tokens, out.shape[1], cdiv(head_dim, slice_d)), mid_o, mid_lse, out,
        mid_o.stride(0), mid_o.stride(1), mid_lse.stride(0), mid_lse.stride(1), out.stride(0), out.stride(1),
        kv_splits, HEAD_DIM=head_dim, SPLIT_STRIDE=width, SLICE_D=slice_d,
        SPLITS_P2=next_power_of_2(kv_splits), num_warps=4, num_stages=1,
    )




def extend_launch(
    num_heads: int, group: int, requests: int, max_extend_len: int, longest_keys: int, sms: int,
    large_block_m: int, heads: int | None = None, kv_splits: int | None = None, block_m: int | None = None,
) -> tuple[int, int, int, int]:
    """(q heads a program, query block rows, query blocks a request, key splits) of an extend
    step; `heads`, `kv_splits` and `block_m` override the choice (tests, benchmarks)."""
    heads = heads or extend_heads(num_heads, group, max_extend_len)
    if block_m is None:
        block_m = small_block_m(max_extend_len * heads) if max_extend_len <= SMALL_EXTEND else large_block_m
    blocks = cdiv(max_extend_len, block_m // heads)
    if kv_splits is None:
        programs = num_heads // heads * requests * blocks
        min_keys = HEADS_MIN_SPLIT_KEYS if heads > 1 else MIN_SPLIT_KEYS
        kv_splits = extend_kv_splits(programs, longest_keys, sms, min_keys)
    return heads, block_m, blocks, kv_splits


def sm_count(device: torch.device) -> int:
    """The SMs a step's programs can fill (1 on the CPU, where the interpreter runs them)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def extend_kv_splits(programs: int, longest_keys: int, sms: int, min_split_keys: int = MIN_SPLIT_KEYS) -> int:
    """Chunks to split each program's keys into: 1 unless the step's programs fill less than
    SPLIT_BELOW_WAVES waves of the SMs and its longest request has keys to share out; then
    about two programs an SM."""
    if programs >= SPLIT_BELOW_WAVES * sms:
        return 1
    return max(1, min(MAX_KV_SPLITS, cdiv(2 * sms, programs), longest_keys // min_split_keys))


def extend_attention(
    q: torch.Tensor,  # [num_tokens, heads, head_dim]
    k_cache: torch.Tensor, v_cache: torch.Tensor,  # [num_slots, kv_heads, head_dim], new tokens stored
    out: torch.Tensor,  # [num_tokens, heads, head_dim], written in place
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
    extend_prefix_lens: torch.Tensor, extend_seq_lens: torch.Tensor, extend_start_loc: torch.Tensor,
    sm_scale: float, max_extend_len: int, longest_keys: int = 0, new_tokens: int | None = None,
    kv_splits: int | None = None, heads: int | None = None,
) -> None:
    """Causal attention of each request's new tokens over its prefix and themselves.

    `max_extend_len` (at least 1) bounds the grid; rows past the real tokens are left alone.
    `longest_keys`, the most keys a request of the step sees (prefix plus new tokens), lets a
    step with few programs split its keys (`extend_kv_splits`); `kv_splits` and `heads` (q
    heads a program takes as rows, `extend_heads`) override the choice (tests, benchmarks). `new_tokens`, the real rows (all of them by default), bounds the
    merge of split keys, which would otherwise write the padding rows."""
    num_tokens, num_heads, head_dim = q.shape
    group = num_heads // k_cache.shape[1]
    assert q.stride(2) == k_cache.stride(2) == v_cache.stride(2) == out.stride(2) == 1
    assert req_to_token.stride(1) == 1
    large_block_m, block_n, num_warps, num_stages = launch_config(head_dim)
    heads, block_m, blocks, kv_splits = extend_launch(
        num_heads, group, req_pool_indices.shape[0], max_extend_len, longest_keys, sm_count(q.device),
        large_block_m, heads, kv_splits,
    )
    block_d = next_power_of_2(head_dim)
    mid_o = mid_lse = out  # unread with one split
    if kv_splits > 1:
        mid_o, mid_lse = split_scratch(num_tokens, num_heads, block_d, kv_splits, q.device)
    # Heads vary fastest so the q heads of one GQA group read the same K/V from L2.
    _EXTEND.launch(
        (num_heads // heads, req_pool_indices.shape[0], blocks * kv_splits), q, k_cache,
        v_cache, out, mid_o, mid_lse, req_to_token, req_pool_indices,
        extend_prefix_lens, extend_seq_lens, extend_start_loc, sm_scale * LOG2_E,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1), out.stride(0), out.stride(1), req_to_token.stride(0),
        mid_o.stride(0), mid_o.stride(1), mid_lse.stride(0), mid_lse.stride(1), kv_splits,
        GROUP=group, HEAD_DIM=head_dim, BLOCK_D=block_d,
        BLOCK_M=block_m, BLOCK_N=block_n, SPLIT=kv_splits > 1, HEADS=heads,
        num_warps=num_warps, num_stages=num_stages,
    )
    if kv_splits > 1:
        merge_splits(mid_o, mid_lse, out, num_tokens if new_tokens is None else new_tokens, head_dim, block_d,
                     kv_splits)
