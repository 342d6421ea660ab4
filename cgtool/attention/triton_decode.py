"""Split-KV decode attention (flash-decoding) over the token-granular KV pool.

Stage 1 cuts the batch's keys into chunks of one length for every request, so a request
gets chunks in proportion to its context and every program reads about as many keys: the
step costs the context read in all, not its longest request. (With a fixed number of chunks
per request, a replay of the Mooncake trace spent most of its decode residual on the
batch's longest request: docs/replay.md.) One program attends the whole GQA group of q heads
of one KV head over one chunk, so each K/V row is read once per group and the scores come
from one tensor-core dot. Stage 2 merges each request's chunks by their log-sum-exp.

A small kernel works out the chunking from `seq_lens` once a forward and both stages read it
(the grids depend only on the batch size), so a CUDA graph captured at one batch size replays
correctly for any lengths. Rows of one token (a padded batch's filler rows) do not count toward
the chunk length, so a batch padded to a captured size chunks its real rows exactly as eagerly
at its own size and reads the same bits.

MLA's decode (cgtool.attention.triton_mla) still cuts each request into a number of chunks
fixed by the batch size, with the helpers `split_bounds` and `merge_head` below.
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
    """A power of two fixed by the batch size, so a captured graph's grid stays valid.

    MLA's chunks per request; for GQA, the partials' room per request (`chunk_slots`)."""
    wanted = next_power_of_2(cdiv(TARGET_PROGRAMS, batch_size * kv_heads))
    return max(MIN_KV_SPLITS, min(MAX_KV_SPLITS, wanted))


# Chunks a GQA decode step aims for, a KV head: CHUNKS_PER_ROW for each real row (as many
# programs as the fixed splits kept from 8 rows up, which the H200 needed: with 128 chunks in
# all, 64 rows of 4k tokens ran at 59% of the K/V read bound against their 92%), and never
# fewer than target_chunks. Both count only real rows, never the batch size: a number that
# depended on it would chunk a padded batch apart from its own.
CHUNKS_PER_ROW = MIN_KV_SPLITS - 1


def target_chunks(kv_heads: int) -> int:
    """The fewest chunks a GQA decode step aims for, a KV head, however few its rows."""
    return max(MERGE_LANES.value, TARGET_PROGRAMS // kv_heads)


def chunk_slots(batch_size: int, kv_heads: int, chunks: int, per_row: int = CHUNKS_PER_ROW) -> int:
    """Room for the partial results of a GQA step of `batch_size` rows, a head.

    Cutting the keys in all into C chunks and rounding up gives each row at most one chunk
    more (filler rows one each), so C + batch_size always hold them, C being the most the
    step aims for (every row real). The room is never less than the fixed-splits kernel
    before it kept (batch_size x num_kv_splits_for), the size whose graph pools the memory
    terms were measured with (cgtool.planner.memory_terms): the same from 8 rows up."""
    most = max(chunks, per_row * batch_size)
    return max(most + batch_size, batch_size * num_kv_splits_for(batch_size, kv_heads))


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
def _chunk_plan_kernel(
    seq_lens, Plan, bs,
    BLOCK_BS: tl.constexpr, CHUNKS: tl.constexpr, PER_ROW: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Program b writes row b's part of the plan (`plan_layout`).

    One chunk length for every row: the keys in all over max(CHUNKS, PER_ROW x real rows),
    at least the longest row's over MERGE_LANES (stage 2 merges at most that many), whole
    BLOCK_N multiples. Rows of one token are filler, left out of the counts and sums (see the
    module docstring); each still gets its chunk."""
    b = tl.program_id(0)
    offs_b = tl.arange(0, BLOCK_BS)
    lens = tl.load(seq_lens + offs_b, mask=offs_b < bs, other=0)
    counted = tl.where(lens > 1, lens, 0)
    aim = tl.maximum(tl.sum((lens > 1).to(tl.int32), 0) * PER_ROW, CHUNKS)
    keys = tl.maximum(tl.cdiv(tl.sum(counted, 0), aim), tl.cdiv(tl.max(counted, 0), MERGE_LANES))
    keys = tl.maximum(tl.cdiv(keys, BLOCK_N), 1) * BLOCK_N
    counts = tl.cdiv(lens, keys)
    ends = tl.cumsum(counts, 0)
    count = tl.sum(tl.where(offs_b == b, counts, 0), 0)
    first = tl.sum(tl.where(offs_b == b, ends, 0), 0) - count
    offs_s = tl.arange(0, MERGE_LANES)
    tl.store(Plan + 2 + 2 * bs + first + offs_s, b * MERGE_LANES + offs_s, mask=offs_s < count)
    tl.store(Plan + 2 + b, first)
    tl.store(Plan + 2 + bs + b, count)
    if b == 0:
        tl.store(Plan, keys)
        tl.store(Plan + 1, tl.sum(counts, 0))


@triton.jit
def _decode_stage1(
    Q, K, V, MidOut, MidLse, req_to_token, req_pool_indices, seq_lens, Plan, scale_log2,
    stride_req, bs,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # Every tensor but req_to_token is contiguous, so its strides follow from the grid and
    # the constexprs: fewer arguments are less host time at each launch.
    # Chunks on the grid's first axis: the others stop at 65,535 programs, which 16 chunks a
    # request pass from 4,096 requests up (an eager step of verify's). Which axis varies
    # fastest made no difference on the H200 (benchmarks/results/h200-2026-11-26-decode-chunks).
    chunk = tl.program_id(0)  # of the whole batch, request by request
    kv_head = tl.program_id(1)
    num_heads = tl.num_programs(1) * GROUP
    stride_qb, stride_qh = num_heads * HEAD_DIM, HEAD_DIM  # q: [bs, heads, head_dim]
    stride_kt, stride_kh = tl.num_programs(1) * HEAD_DIM, HEAD_DIM  # [slots, kv_heads, head_dim]
    # The three loads before the test, so that they are in flight together (a spare
    # program's entry is never written, and never used).
    total, keys, entry = tl.load(Plan + 1), tl.load(Plan), tl.load(Plan + 2 + 2 * bs + chunk)
    if chunk >= total:
        return  # a spare program: the chunks ran out
    b = entry // MERGE_LANES
    split_start = (entry % MERGE_LANES) * keys
    split_end = tl.minimum(split_start + keys, tl.load(seq_lens + b))

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
    rows = chunk * num_heads + heads  # [chunk, head] rows of the partials
    tl.store(
        MidOut + rows[:, None] * HEAD_DIM + offs_d[None, :], acc / l_i[:, None],
        mask=mask_h[:, None] & mask_d[None, :],
    )
    tl.store(MidLse + rows, m_i + tl.log2(l_i), mask=mask_h)


@triton.jit
def merge_head(
    MidOut, MidLse, O, b, head, seq_len,
    stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
    LANES: tl.constexpr, d_start=0, chunk_keys=None,
):
    """One head's output from its chunks, weighted by their log-sum-exps; `chunk_keys`, where
    given, is the keys a chunk held (else `split_len`'s).

    The sums run over LANES lanes (a power of two, at least NUM_SPLITS). MERGE_LANES whatever
    the split count adds the same chunks up in the same order at any count; fewer lanes take
    fewer registers, so more programs fit an SM."""
    offs_s = tl.arange(0, LANES)
    if chunk_keys is None:
        chunk_keys = split_len(seq_len, NUM_SPLITS, BLOCK_N)
    used = offs_s * chunk_keys < seq_len  # stage 1 skipped the rest
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
    MidOut, MidLse, O, Plan, bs, stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """One head of one request from its chunks, weighted by their log-sum-exps. The sums run
    over MERGE_LANES lanes however many chunks there are, so the same chunks always add up in
    the same order."""
    b = tl.program_id(0)
    head = tl.program_id(1)
    num_heads = tl.num_programs(1)
    first = tl.load(Plan + 2 + b)
    count = tl.load(Plan + 2 + bs + b)
    offs_s = tl.arange(0, MERGE_LANES)
    used = offs_s < count
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    rows = (first + offs_s) * num_heads + head  # [chunk, head] rows of the partials
    lse = tl.load(MidLse + rows, mask=used, other=float("-inf"))
    parts = tl.load(
        MidOut + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=used[:, None] & mask_d[None, :], other=0.0,
    )  # [MERGE_LANES, BLOCK_D]
    lse_max = tl.max(lse, 0)
    weights = tl.where(used, tl.exp2(lse - lse_max), 0.0)
    total = tl.sum(weights, 0)
    merged = tl.sum(parts * weights[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(O + b * stride_ob + head * stride_oh + offs_d, merged.to(O.dtype.element_ty), mask=mask_d)


_PLAN = CachedKernel(_chunk_plan_kernel)
_STAGE1 = CachedKernel(_decode_stage1)
_STAGE2 = CachedKernel(_decode_stage2)


def decode_scratch(
    batch_size: int, num_heads: int, width: int, num_kv_splits: int, device: torch.device,
    shared: dict[object, Any] | None = None, partial_dtype: torch.dtype = torch.float32,
    any_splits: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial outputs (fp32 unless `partial_dtype`) and fp32 log-sum-exps of every chunk.

    From `shared` (a forward's workspace, `batch.forward_scratch()`) where it already holds
    a block of this shape: the layers run one after the other, so one block serves them
    all. Inside a capture it comes from the graph pool. `any_splits`: the caller's merge
    spans any count (gluon_mla_wgmma's flat slots), so MAX_KV_SPLITS does not bound it.
    """
    # The merge kernels span a request's chunks in MERGE_LANES lanes or one static loop.
    assert any_splits or num_kv_splits <= MAX_KV_SPLITS, "the merge spans at most MAX_KV_SPLITS chunks"
    key = ("decode_scratch", batch_size, num_heads, width, num_kv_splits, device, partial_dtype)
    found = shared.get(key) if shared is not None else None
    if found is not None:
        return found
    mid_out = torch.empty(
        (batch_size, num_heads, num_kv_splits, width), dtype=partial_dtype, device=device
    )  # [bs, heads, num_kv_splits, width]
    mid_lse = torch.empty(
        (batch_size, num_heads, num_kv_splits), dtype=torch.float32, device=device
    )  # [bs, heads, num_kv_splits], base-2 log-sum-exp
    if shared is not None:
        shared[key] = (mid_out, mid_lse)
    return mid_out, mid_lse


def chunk_scratch(
    slots: int, num_heads: int, head_dim: int, device: torch.device,
    shared: dict[object, Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 partial outputs [slots, heads, head_dim] and base-2 log-sum-exps [slots, heads]
    of a GQA step's chunks; from `shared` as `decode_scratch`."""
    key = ("chunk_scratch", slots, num_heads, head_dim, device)
    found = shared.get(key) if shared is not None else None
    if found is not None:
        return found
    mid_out = torch.empty((slots, num_heads, head_dim), dtype=torch.float32, device=device)
    mid_lse = torch.empty((slots, num_heads), dtype=torch.float32, device=device)
    if shared is not None:
        shared[key] = (mid_out, mid_lse)
    return mid_out, mid_lse


def chunk_plan(
    seq_lens: torch.Tensor, kv_heads: int, chunks: int | None = None, memo: dict[object, Any] | None = None,
) -> tuple[torch.Tensor, int]:
    """(plan, chunk slots) of a GQA decode step: int32 [2 + 2 bs + slots] holding the chunk
    length, the chunks in all, each row's first chunk, each row's chunks, and each chunk's row
    x MERGE_LANES + its place in the row. From `memo` (`batch.forward_memo()`) when a layer
    of this forward already planned this batch: the lengths are the same for every layer."""
    chunks, per_row = chunks or target_chunks(kv_heads), CHUNKS_PER_ROW
    bs = seq_lens.shape[0]
    slots = chunk_slots(bs, kv_heads, chunks, per_row)
    key = ("decode_chunk_plan", seq_lens.data_ptr(), bs, chunks, per_row)
    found = memo.get(key) if memo is not None else None
    if found is not None:
        return found, slots
    plan = torch.empty(2 + 2 * bs + slots, dtype=torch.int32, device=seq_lens.device)
    _PLAN.launch(
        (bs,), seq_lens, plan, bs, BLOCK_BS=next_power_of_2(bs), CHUNKS=chunks, PER_ROW=per_row,
        BLOCK_N=launch_config()[0], num_warps=4, num_stages=1,
    )
    if memo is not None:
        memo[key] = plan
    return plan, slots


def decode_attention(
    q: torch.Tensor,  # [bs, heads, head_dim]
    k_cache: torch.Tensor, v_cache: torch.Tensor,  # [num_slots, kv_heads, head_dim] each
    out: torch.Tensor,  # [bs, heads, head_dim], written in place
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
    sm_scale: float, chunks: int | None = None, scratch: dict[object, Any] | None = None,
    memo: dict[object, Any] | None = None,
) -> None:
    """One query per request over keys 0..seq_lens[b]-1 (the new token included), the
    batch's keys cut into chunks of one length (`chunk_plan`; `chunks` overrides
    `target_chunks`); no host synchronisation. `scratch`: see `decode_scratch`; `memo`:
    see `chunk_plan`."""
    bs, num_heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    assert q.is_contiguous() and k_cache.is_contiguous() and v_cache.is_contiguous()
    assert out.stride(2) == 1
    assert req_to_token.stride(1) == 1
    plan, slots = chunk_plan(seq_lens, kv_heads, chunks, memo)
    mid_out, mid_lse = chunk_scratch(slots, num_heads, head_dim, q.device, scratch)
    block_n, num_warps, num_stages = launch_config()
    group, block_d = num_heads // kv_heads, next_power_of_2(head_dim)
    _STAGE1.launch(
        (slots, kv_heads), q, k_cache, v_cache, mid_out, mid_lse, req_to_token,
        req_pool_indices, seq_lens, plan, sm_scale * LOG2_E, req_to_token.stride(0), bs,
        GROUP=group, HEAD_DIM=head_dim, BLOCK_D=block_d,
        BLOCK_H=max(MIN_BLOCK_H, next_power_of_2(group)), BLOCK_N=block_n,
        num_warps=num_warps, num_stages=num_stages,
    )
    _STAGE2.launch(
        (bs, num_heads), mid_out, mid_lse, out, plan, bs, out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, BLOCK_D=block_d, num_warps=4, num_stages=1,
    )
