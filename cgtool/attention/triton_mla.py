"""MLA attention over the latent KV pool: every query head attends one shared latent head.

Each slot of layer l holds one latent row of `rank + rope` values (kv_lora_rank 512 plus
qk_rope_head_dim 64 for DeepSeek). A query head's score against a token is its dot with the
whole row; its output is the softmax-weighted sum of the rows' first `rank` values. So one
latent row read from memory serves as the key and the value of all heads at once, and the
kernels read it once per block of heads, never a separate V.

The 576 values are not a power of two: the row is handled as a `rank` part and a `rope`
part, each padded to its own power of two, so neither pays for the other's padding.

On a Hopper GPU where Triton's Gluon runs, decode's stage 1 is gluon_mla's kernel (its buffers
placed by hand), with this module's chunks, partials and merge; this module's stage 1 serves
elsewhere and in Triton's interpreter.

Decode splits each request's context into `num_kv_splits` chunks (fixed by the batch size)
and merges them by log-sum-exp: up to FUSED_MERGE_SPLITS chunks in the program that finishes
a request's chunks last (runtime.tickets), beyond that in a second kernel built on the dense
decode kernel's `merge_head`. Grids depend only on the batch size and chunk bounds come from
`seq_lens` in the kernel, so a decode graph captured at one batch size replays for any
lengths. Extend (eager, between piecewise graph pieces) is causal over prefix plus new tokens,
one program per (head, request, query block), or for a step of few new tokens per (request,
query block) with every head of a token as a row: the heads share the latent rows, so they
are read once a block, not once a head.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from cgtool.attention import gluon_mla, gluon_mla_wgmma
from cgtool.attention.triton_decode import (
    MAX_KV_SPLITS,
    decode_scratch,
    merge_head,
    split_len,
    store_split,
)
from cgtool.attention.triton_extend import (
    block_and_split,
    extend_launch,
    merge_splits,
    query_rows,
    sm_count,
    split_keys,
    split_scratch,
    store_split_partial,
)
from cgtool.attention.triton_keys import BEFORE_END, CAUSAL, block_slots
from cgtool.attention.triton_softmax import LOG2_E, online_softmax_init, online_softmax_step
from cgtool.runtime.dependent_launch import (
    dependent_launch,
    release_next_kernel,
    wait_for_previous_kernel,
)
from cgtool.runtime.kernel_trace import sm_id, stamp_after, trace_store
from cgtool.runtime.tickets import tickets
from cgtool.runtime.triton_launch import CachedKernel, cdiv, next_power_of_2

# Heads of one program: tl.dot needs 16 rows, and 16 heads x 512 fp32 accumulators fit the
# registers of 4 warps.
BLOCK_H = 16
# tl.dot needs at least 16 along every dimension: narrower parts are padded with masked lanes.
MIN_DOT = 16
# Decode's (keys per step, warps, pipeline stages): 64 keys a step, 1.1-1.3x the 32 before
# (H200, 2026-11-26, benchmarks/results/h200-2026-11-26-moe-mla/call1/moe-mla.json). At 8 warps,
# but at 4 for up to FOUR_WARPS_SPLITS chunks a request merged in the last program. With bf16
# partials (below) 8 warps beat 4 with fp32 at 4-6 chunks: bs 40-66 at a 1k context 6-9% faster
# on both GPUs, at 8k 1-2% faster on the H100 and 1-4% slower on the H200; at 1-2 chunks 8 warps
# were 2-5% slower on the H200 (bs 96-256) and at bs 96 x 8k 4% on the H100
# (h100-h200-2026-11-26-mla-floor, calls 9 and 11).
DECODE_TILES = (64, 8, 2)
DECODE_TILES_FEW_CHUNKS = (64, 4, 2)
FOUR_WARPS_SPLITS = 3
# The most programs stage 1 takes: the chunks a request are the most that keep the batch within
# it, two programs an SM on the 132 SMs of an H100 SXM or an H200 (past MERGE_POW2_SPLITS, a
# power of two). A chunk's partial output is a whole 512-wide latent per head (32 KiB fp32 for
# 16 heads), so each chunk adds writes that the dense kernel's 128-wide heads do not. In call4's
# sweep bs 256 ran fastest in one chunk a request (92 us at a 1k context against 102 in two),
# bs 64 in four, bs 1 in 32-64. Aiming at 256 left up to a third of the SMs a program short: bs
# 88 in 3 chunks rather than 2 ran 11% faster at a 1k context and 25% at 8k, bs 66 in 4 rather
# than 3 7% and 18% (H200, benchmarks/results/h100-h200-2026-11-26-mla-floor).
MLA_TARGET_PROGRAMS = 264
# The merge reads a head's 64 chunk lanes in slices this wide: a whole [64, 512] fp32 tile
# per program spilled registers and cost ~3.9 us a request whatever the context (bs 256 at a
# 1k context ran 1.0 ms where its latent read takes 0.07).
MERGE_SLICE = 128
# After gluon_mla's stage 1 the whole 512-wide latent at once: 0.5-2.4 us a layer shorter than in
# slices of 128 on the H100 (bs 16-128 x 1k, bs 8-32 x 8k; the stage's 4 warps hold [16, 512]
# fp32 in 64 registers a thread), 256 in between. With triton_mla's stage 1 it made no
# difference here either (h100-2026-11-27-gluon-mla, call 13). The merge kernel's tile
# of lanes x columns stays at 64 x 128 values, which did not spill.
BUFFERED_MERGE_SLICE = 512
MERGE_TILE_VALUES = 64 * 128
# Up to this many chunks a request, the program that finishes a request's head block last
# merges its chunks (runtime.tickets) instead of a second launch; past it one program's merge
# would read too many partials alone. call4: bs 64 at a 1k context 37 us against 53 with the
# merge kernel. From 9 chunks (bs 17-29) the merge kernel over fewer lanes beat 8 chunks merged
# in the last program: bs 20 x 8k 69 us against 98, bs 24 80 against 101, at 1k 22 against 25
# and 24 against 25; bs 28 x 1k 4% slower (H200, h100-h200-2026-11-26-mla-floor).
FUSED_MERGE_SPLITS = 8
# Chunk counts from here on are powers of two (few kernels to compile for a capture).
MERGE_POW2_SPLITS = 16
# With the merge in the last program, a request's chunk holds at least this many keys, or as
# many as fill half the batch's chunks, so a short context fills fewer chunks and the rest
# return at once. bs 32-48 over 512-1k-token contexts ran 1.1-1.2x faster on both GPU classes,
# while 2k-8k contexts keep all 8 chunks of bs 32 (2026-11-26,
# benchmarks/results/h100-h200-2026-11-26-mla-chunks).
FUSED_MIN_CHUNK = 256
# The chunks' partial outputs, [16 heads, 512] a chunk: bf16 where stage 1 runs 8 warps and
# merges in its last program (4-8 chunks), 1-9% faster there at 8 warps (bs 24-66 at 1k-8k on
# both GPUs, but the H200 at 8k above); fp32 elsewhere: bf16 slowed the 4-warp loop 12-37% (its
# registers fell and ptxas scheduled it worse) and sped up no shape on the merge kernel's path
# (h100-2026-11-26-mla-timeline/call7, in git history at 532ce70; h100-h200-2026-11-26-mla-floor).
PARTIAL_DTYPE = torch.float32
PARTIAL_DTYPE_EIGHT_WARPS_FUSED = torch.bfloat16
# Where Gluon runs (gluon_mla.available), stage 1 is gluon_mla's kernel with two tiles of 32
# keys, 4 warps: the next tile's copies fly during this tile's products, two programs an SM
# (93 KB of shared memory). With bf16 partials where the last program merges and fp32 where the
# merge kernel does, and the merge over BUFFERED_MERGE_SLICE columns, its launches were 3-29%
# shorter than this module's kernel's at 1k and 8k contexts, bs 1-256, on the H100
# (h100-2026-11-27-gluon-mla, call 18; settings in calls 1-3). 64 keys, 8 warps, 16 keys
# in 3-4 tiles and 3 tiles of 32 were slower.
BUFFERED_TILES = (32, 4, 1)
BUFFERED_TILES_COUNT = 2
# gluon_mla_wgmma's stage 1 (warpgroup MMA, 64 keys a tile, one program an SM) serves one head
# block's requests from WGMMA_MIN_BS to WGMMA_PROGRAMS, the batch's key tiles shared among the
# 132 SMs' programs. Against gluon_mla's (H100, h200-2026-11-27-wgmma-mla call 18): a padded
# batch's layer 24-28% shorter (41 requests of 14.7k tokens in a graph of 71, 20 of 1k in 33),
# bs 32-48 x 1k 3-6% shorter, bs 17-24 x 1k, bs 128 x 1k and bs 32-64 x 8k within 4%, bs 96 x 1k
# and bs 48 x 8k 5% longer. Below, gluon_mla's two programs an SM with the merge kernel were
# faster (bs 16 x 1k 11.6 us against 13.2-15.1, H200 calls 2-3); past it one chunk a request
# fills the SMs twice (bs 256 x 1k 83.6 against 80.4).
WGMMA_MIN_BS = 17
WGMMA_PROGRAMS = 132
# Its chunks hold at least this many keys (FUSED_MIN_CHUNK is gluon_mla's and triton_mla's):
# bs 17-20 x 1k 6-7% faster than at 256, bs 24-32 x 512 15-19%, the same from bs 24 x 1k and
# at 2k-4k (H200, h200-2026-11-27-wgmma-mla call 7, with a whole number of chunks a request
# then); 64 was the same as 128.
WGMMA_MIN_CHUNK = 128
# With gluon_mla's stage 1 and the merge kernel (past FUSED_MERGE_SPLITS chunks), a chunk holds
# at least this many keys: bs 8 x 1k 11.5 us against 13.2 in chunks of 32, bs 16 15.8 against
# 16.6, no change at bs 24 x 1k nor at 8k (H100, call 8 there). Merged in the last program,
# 128 instead of FUSED_MIN_CHUNK was within 3% either way.
BUFFERED_MERGE_KERNEL_MIN_CHUNK = 128
# Extend's (query rows, keys per step, warps, stages): the best of the same sweep, 2.0-2.7x
# the (32, 32, 8, 2) before at 2k-8k new tokens, with or without a cached prefix.
EXTEND_TILES = (64, 64, 8, 2)


@triton.jit
def _attend_latent_block(
    acc, l_i, m_i, q_r, q_p, q_pos, Kv, token_row, start_n, kv_end, scale_log2,
    offs_r, mask_r, offs_p, mask_p, stride_kt,
    RANK: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr,
):
    """One online-softmax step over latent rows start_n..start_n + BLOCK_N - 1, each row the
    key (rank and rope parts) and the value (rank part) of every head."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    mask_n = offs_n < kv_end
    rows = Kv + block_slots(token_row, offs_n, mask_n)[:, None] * stride_kt
    kv = tl.load(rows + offs_r[None, :], mask=mask_n[:, None] & mask_r[None, :], other=0.0)
    pe = tl.load(rows + RANK + offs_p[None, :], mask=mask_n[:, None] & mask_p[None, :], other=0.0)
    s = tl.dot(q_r, tl.trans(kv).to(q_r.dtype)) + tl.dot(q_p, tl.trans(pe).to(q_p.dtype))
    visible = mask_n[None, :]
    if MASK == CAUSAL:
        # Key 0 is visible to every query, so no row is ever fully masked (no NaN).
        visible = visible & (offs_n[None, :] <= q_pos[:, None])
    s = tl.where(visible, s * scale_log2, float("-inf"))
    return online_softmax_step(acc, l_i, m_i, s, kv)


@triton.jit
def _chunk_len(seq_len, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, MIN_CHUNK: tl.constexpr):
    """Keys per chunk: `split_len`, but at least MIN_CHUNK (a multiple of BLOCK_N) as long as
    the request still fills half its chunks: bs 32 over 512 keys in 2 chunks of 256 ran 1.1x
    slower than in 8 of 64 on the H200 (mla-chunks call5-h200)."""
    half: tl.constexpr = max(NUM_SPLITS // 2, 1)
    floor = tl.minimum(MIN_CHUNK, split_len(seq_len, half, BLOCK_N))
    return tl.maximum(split_len(seq_len, NUM_SPLITS, BLOCK_N), floor)


@triton.jit
def _merge_head_block(
    MidOut, MidLse, O, b, heads, mask_h, seq_len,
    stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ob, stride_oh,
    RANK: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr, MIN_CHUNK: tl.constexpr,
):
    """The heads' outputs from their chunks, as `merge_head`: weights 2^(lse - max), the
    chunks added in split order, so chunks a request leaves empty add exact zeros. Loads go
    to L2 (.cg): other programs wrote the partials, and L1 is not coherent with them."""
    keys = _chunk_len(seq_len, NUM_SPLITS, BLOCK_N, MIN_CHUNK)
    lse_ptrs = MidLse + b * stride_lb + heads * stride_lh
    lse_max = tl.full((BLOCK_H,), float("-inf"), tl.float32)
    for s in tl.static_range(NUM_SPLITS):
        # A [BLOCK_H] mask, not a scalar one: Triton's interpreter refuses those.
        used = tl.full((BLOCK_H,), s, tl.int32) * keys < seq_len
        lse = tl.load(lse_ptrs + s, mask=mask_h & used, other=float("-inf"), cache_modifier=".cg")
        lse_max = tl.maximum(lse_max, lse)
    lse_max = tl.where(mask_h, lse_max, 0.0)
    for d0 in tl.static_range(0, RANK, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        mask_d = offs_d < RANK
        acc = tl.zeros((BLOCK_H, BLOCK_D), dtype=tl.float32)
        total = tl.zeros((BLOCK_H,), dtype=tl.float32)
        for s in tl.static_range(NUM_SPLITS):
            used = mask_h & (tl.full((BLOCK_H,), s, tl.int32) * keys < seq_len)
            lse = tl.load(lse_ptrs + s, mask=used, other=float("-inf"), cache_modifier=".cg")
            weight = tl.where(used, tl.exp2(lse - lse_max), 0.0)
            part = tl.load(
                MidOut + b * stride_mb + heads[:, None] * stride_mh + s * stride_ms + offs_d[None, :],
                mask=used[:, None] & mask_d[None, :], other=0.0, cache_modifier=".cg",
            )
            acc += part * weight[:, None]
            total += weight
        merged = acc / tl.where(total > 0, total, 1.0)[:, None]
        tl.store(O + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                 merged.to(O.dtype.element_ty), mask=mask_h[:, None] & mask_d[None, :])


@triton.jit
def _mla_decode_stage1(
    Q, Kv, MidOut, MidLse, O, Tickets, req_to_token, req_pool_indices, seq_lens, scale_log2, Trace,
    stride_qb, stride_qh, stride_kt, stride_req, stride_mb, stride_mh, stride_ms,
    stride_lb, stride_lh, stride_ob, stride_oh,
    NUM_HEADS: tl.constexpr, RANK: tl.constexpr, ROPE: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, MIN_CHUNK: tl.constexpr, FUSED_MERGE: tl.constexpr,
    MERGE_D: tl.constexpr, TRACE: tl.constexpr, RELEASE: tl.constexpr,
):
    b = tl.program_id(0)
    head_block = tl.program_id(1)
    split = tl.program_id(2)
    # TRACE (benchmarks/probe_mla_timeline.py): the SM, then stamps at the start, once the
    # request's row is known, after the loop, after the ticket, after the merge.
    program = (b * tl.num_programs(1) + head_block) * tl.num_programs(2) + split
    if TRACE:
        trace_store(Trace, program, 0, sm_id())
        trace_store(Trace, program, 1, stamp_after(b))
    seq_len = tl.load(seq_lens + b)
    keys = _chunk_len(seq_len, NUM_SPLITS, BLOCK_N, MIN_CHUNK)
    split_start = split * keys
    split_end = tl.minimum(split_start + keys, seq_len)
    heads = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = heads < NUM_HEADS
    if split_end > split_start:  # the merge skips empty chunks
        offs_r = tl.arange(0, BLOCK_R)
        mask_r = offs_r < RANK
        offs_p = tl.arange(0, BLOCK_P)
        mask_p = offs_p < ROPE
        q_rows = Q + b * stride_qb + heads[:, None] * stride_qh
        q_r = tl.load(q_rows + offs_r[None, :], mask=mask_h[:, None] & mask_r[None, :], other=0.0)
        q_p = tl.load(q_rows + RANK + offs_p[None, :], mask=mask_h[:, None] & mask_p[None, :], other=0.0)
        pool_row = tl.load(req_pool_indices + b)
        token_row = req_to_token + pool_row.to(tl.int64) * stride_req
        if TRACE:
            trace_store(Trace, program, 2, stamp_after(pool_row))

        acc, l_i, m_i = online_softmax_init(BLOCK_H, BLOCK_R)
        for start_n in range(split_start, split_end, BLOCK_N):
            acc, l_i, m_i = _attend_latent_block(
                acc, l_i, m_i, q_r, q_p, 0, Kv, token_row, start_n, split_end, scale_log2,
                offs_r, mask_r, offs_p, mask_p, stride_kt, RANK, BLOCK_N, BEFORE_END,
            )
        if TRACE:
            trace_store(Trace, program, 3, stamp_after(tl.sum(l_i)))
        # One chunk a request still goes through the partials and the merge: storing the bf16
        # output from here ran 1.3x slower (bs 256, H200, call5).
        store_split(
            MidOut, MidLse, acc, l_i, m_i, b, heads, split, offs_r, mask_h, mask_r,
            stride_mb, stride_mh, stride_ms, stride_lb, stride_lh,
        )
    # With the merge a kernel apart, launched as a programmatic dependent: let it be scheduled
    # now, its programs waiting for this launch's partials.
    release_next_kernel(RELEASE)
    # The chunks that hold keys take a ticket (chunk 0 always, so a request of no keys still
    # gets its zeros); the rest return at once. With every chunk taking one, bs 32 x 1k ran
    # 0.5 us slower and bs 256 x 1k 4% slower (H100, mla-chunks calls 3, 4 and 8).
    chunks = tl.maximum(tl.cdiv(seq_len, tl.maximum(keys, 1)), 1)  # no keys: 0 keys a chunk
    if FUSED_MERGE and split < chunks:
        # The barrier puts all of this program's stores before its release.
        tl.debug_barrier()
        ticket = Tickets + b * tl.num_programs(1) + head_block
        drawn = tl.atomic_add(ticket, 1, sem="acq_rel", scope="gpu")
        if TRACE:
            trace_store(Trace, program, 4, stamp_after(drawn))
        if drawn == chunks - 1:
            tl.atomic_xchg(ticket, 0, sem="relaxed", scope="gpu")
            _merge_head_block(
                MidOut, MidLse, O, b, heads, mask_h, seq_len,
                stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ob, stride_oh,
                RANK, BLOCK_H, MERGE_D, BLOCK_N, NUM_SPLITS, MIN_CHUNK,
            )
            if TRACE:
                trace_store(Trace, program, 5, stamp_after(drawn))


@triton.jit
def _mla_extend_kernel(
    Q, Kv, O, MidO, MidLse, req_to_token, req_pool_indices, prefix_lens, extend_lens, start_loc, scale_log2,
    stride_qt, stride_qh, stride_kt, stride_ot, stride_oh, stride_req, stride_mt, stride_mh, stride_lt, stride_lh,
    num_splits,
    RANK: tl.constexpr, ROPE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, HEADS: tl.constexpr,
):
    head_block = tl.program_id(0)
    b = tl.program_id(1)
    block_m, split = block_and_split(num_splits, SPLIT)  # keys split as triton_extend's kernel does
    extend_len = tl.load(extend_lens + b)
    tokens = BLOCK_M // HEADS  # a block's queries, HEADS heads each (triton_extend.query_rows)
    if block_m * tokens >= extend_len:
        return  # the grid is sized for the longest request of the batch

    prefix = tl.load(prefix_lens + b)
    token_row = req_to_token + tl.load(req_pool_indices + b).to(tl.int64) * stride_req
    offs_m, head = query_rows(block_m, head_block, BLOCK_M, HEADS)
    mask_m = offs_m < extend_len
    q_pos = prefix + offs_m
    rows = (tl.load(start_loc + b) + offs_m).to(tl.int64)
    offs_r = tl.arange(0, BLOCK_R)
    mask_r = offs_r < RANK
    offs_p = tl.arange(0, BLOCK_P)
    mask_p = offs_p < ROPE
    q_rows = Q + (rows * stride_qt + head * stride_qh)[:, None]
    q_r = tl.load(q_rows + offs_r[None, :], mask=mask_m[:, None] & mask_r[None, :], other=0.0)
    q_p = tl.load(q_rows + RANK + offs_p[None, :], mask=mask_m[:, None] & mask_p[None, :], other=0.0)

    acc, l_i, m_i = online_softmax_init(BLOCK_M, BLOCK_R)
    kv_end = prefix + tl.minimum(extend_len, (block_m + 1) * tokens)
    unmasked_end = (prefix + block_m * tokens) // BLOCK_N * BLOCK_N
    lo, visible_end = split_keys(unmasked_end, split, num_splits, SPLIT, BLOCK_N)
    # The causal mask is applied to every block: it keeps what the keys before the block's
    # first query would show anyway.
    end = kv_end
    if SPLIT:
        end = tl.where(split == num_splits - 1, kv_end, visible_end)
    for start_n in range(lo, end, BLOCK_N):
        acc, l_i, m_i = _attend_latent_block(
            acc, l_i, m_i, q_r, q_p, q_pos, Kv, token_row, start_n, kv_end, scale_log2,
            offs_r, mask_r, offs_p, mask_p, stride_kt, RANK, BLOCK_N, CAUSAL,
        )

    if SPLIT:
        store_split_partial(MidO, MidLse, acc, l_i, m_i, rows, head, split, offs_r, mask_m, mask_r,
                            stride_mt, stride_mh, stride_lt, stride_lh, BLOCK_R)
    else:
        tl.store(
            O + (rows * stride_ot + head * stride_oh)[:, None] + offs_r[None, :],
            (acc / l_i[:, None]).to(O.dtype.element_ty), mask=mask_m[:, None] & mask_r[None, :],
        )


@triton.jit
def _mla_merge_kernel(
    MidOut, MidLse, O, seq_lens,
    stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ob, stride_oh,
    RANK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
    MIN_CHUNK: tl.constexpr, LANES: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_previous_kernel(PDL)  # stage 1's partials
    b = tl.program_id(0)
    seq_len = tl.load(seq_lens + b)
    merge_head(
        MidOut, MidLse, O, b, tl.program_id(1), seq_len,
        stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ob, stride_oh,
        RANK, BLOCK_D, BLOCK_N, NUM_SPLITS, LANES, tl.program_id(2) * BLOCK_D,
        _chunk_len(seq_len, NUM_SPLITS, BLOCK_N, MIN_CHUNK),
    )


def wgmma_serves(batch_size: int, num_heads: int) -> bool:
    """Whether gluon_mla_wgmma's stage 1 is the default for this batch (where Gluon runs)."""
    return cdiv(num_heads, BLOCK_H) == 1 and WGMMA_MIN_BS <= batch_size <= WGMMA_PROGRAMS


def mla_num_kv_splits(batch_size: int, num_heads: int) -> int:
    """Fixed by the batch size, so a captured graph's grid stays valid: the most chunks a
    request that keep the batch within MLA_TARGET_PROGRAMS programs: any count below
    MERGE_POW2_SPLITS, from there a power of two, for fewer compiled kernels."""
    fits = MLA_TARGET_PROGRAMS // (batch_size * cdiv(num_heads, BLOCK_H))
    if fits < MERGE_POW2_SPLITS:
        return max(1, fits)
    return min(MAX_KV_SPLITS, next_power_of_2(fits + 1) // 2)


_MLA_STAGE1 = CachedKernel(_mla_decode_stage1)
_MLA_MERGE = CachedKernel(_mla_merge_kernel)
_MLA_EXTEND = CachedKernel(_mla_extend_kernel)


def _layout(
    q: torch.Tensor, latent_cache: torch.Tensor, out: torch.Tensor, req_to_token: torch.Tensor
) -> tuple[int, int, int, int]:
    """(rank, rope, BLOCK_R, BLOCK_P): the pool holds one head of rank + rope values a row."""
    rank = out.shape[-1]
    assert latent_cache.shape[1] == 1, "the latent pool holds one head"
    assert q.shape[-1] == latent_cache.shape[-1]
    assert q.stride(-1) == latent_cache.stride(-1) == out.stride(-1) == req_to_token.stride(1) == 1
    rope = latent_cache.shape[-1] - rank
    block_r = max(MIN_DOT, next_power_of_2(rank))
    return rank, rope, block_r, max(MIN_DOT, next_power_of_2(rope))


def _merge_slice(buffers: int, fused: bool, lanes: int) -> int:
    """Columns the merge takes at once: MERGE_SLICE after this module's stage 1; after gluon_mla's,
    BUFFERED_MERGE_SLICE, in the merge kernel as many as keep its tile of lanes x columns at
    MERGE_TILE_VALUES."""
    if not buffers:
        return MERGE_SLICE
    if fused:
        return BUFFERED_MERGE_SLICE
    return max(MERGE_SLICE, min(BUFFERED_MERGE_SLICE, MERGE_TILE_VALUES // lanes))


def _stage1_buffers(q: torch.Tensor, out: torch.Tensor, asked: int | None) -> int:
    """Tiles of rows for gluon_mla's stage 1, 0 for this module's: Gluon where it runs and the
    latent's parts are powers of two, unless `asked` says otherwise."""
    if asked == 0 or not gluon_mla.available(q.device):
        return 0
    if not gluon_mla.supports(out.shape[-1], q.shape[-1] - out.shape[-1]):
        return 0
    return asked or BUFFERED_TILES_COUNT


def mla_decode_attention(
    q: torch.Tensor,  # [bs, heads, rank + rope]
    latent_cache: torch.Tensor,  # [num_slots, 1, rank + rope]
    out: torch.Tensor,  # [bs, heads, rank], written in place
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
    sm_scale: float, num_kv_splits: int, scratch: dict[object, Any] | None = None,
    tiles: tuple[int, int, int] | None = None, fused_merge: bool | None = None,
    trace: torch.Tensor | None = None, partial_dtype: torch.dtype | None = None,
    min_chunk: int | None = None, merge_lanes: int | None = None, buffers: int | None = None,
    merge_slice: int | None = None, score_chains: int | None = None, wgmma: bool | None = None,
    memo: dict[object, Any] | None = None,
) -> None:
    """`triton_decode.decode_attention` over latent rows 0..seq_lens[b]-1. `tiles`,
    `fused_merge`, `partial_dtype`, `min_chunk` and `merge_lanes` override DECODE_TILES, the
    merge's placement, the partials' dtype, the least keys a chunk (FUSED_MIN_CHUNK merged in
    the last program; for the merge kernel none, or BUFFERED_MERGE_KERNEL_MIN_CHUNK after
    gluon_mla's stage 1) and the merge kernel's lanes (the chunk count's power of two); `trace`
    (int64, TRACE_SLOTS a stage-1 program) takes its programs' timestamps (benchmarks) from this
    module's kernel, or from gluon_mla_wgmma's with `wgmma` True; `buffers` is the tiles of rows
    of gluon_mla's stage 1 (0: this module's kernel; default BUFFERED_TILES_COUNT where it runs); `merge_slice` the columns the merge
    takes at once (default `_merge_slice`'s); `score_chains` the running sums of q . k in
    gluon_mla's stage 1 (default `gluon_mla.score_chains`); `wgmma` whether gluon_mla_wgmma's
    stage 1 serves where Gluon runs (default `wgmma_serves`): it shares the batch's keys among
    WGMMA_PROGRAMS programs, at most `num_kv_splits` chunks a request, merged in the last, mapped
    by the step's flat plan from `memo` (`batch.forward_memo()`) once a layer has planned it."""
    # Stamps (`trace`) are this module's kernel's, or gluon_mla_wgmma's where it is asked for.
    buffers = _stage1_buffers(q, out, buffers if trace is None or wgmma else 0)
    wgmma = bool(buffers) and BLOCK_H == gluon_mla_wgmma.BLOCK_H and not gluon_mla_wgmma.refused() and (
        wgmma_serves(*q.shape[:2]) if wgmma is None else wgmma)
    asked_partials = partial_dtype
    # gluon_mla_wgmma's chunks are its own (shared by the batch's lengths): its last program merges.
    fused = wgmma or (num_kv_splits <= FUSED_MERGE_SPLITS if fused_merge is None else fused_merge)
    few = fused and num_kv_splits <= FOUR_WARPS_SPLITS
    block_n, num_warps, num_stages = (gluon_mla_wgmma.WGMMA_TILES[0], 4, 1) if wgmma else tiles or (
        BUFFERED_TILES if buffers else DECODE_TILES_FEW_CHUNKS if few else DECODE_TILES)
    unfused_min = max(block_n, BUFFERED_MERGE_KERNEL_MIN_CHUNK) if buffers else block_n
    least = WGMMA_MIN_CHUNK if wgmma else FUSED_MIN_CHUNK if fused else unfused_min
    min_keys = least if min_chunk is None else min_chunk
    assert min_keys % block_n == 0, f"a chunk's minimum ({min_keys} keys) is whole key blocks of {block_n}"
    bs, num_heads, _ = q.shape
    rank, rope, block_r, block_p = _layout(q, latent_cache, out, req_to_token)
    if partial_dtype is None:
        partial_dtype = PARTIAL_DTYPE_EIGHT_WARPS_FUSED if fused and (num_warps == 8 or buffers) else PARTIAL_DTYPE
    if wgmma and gluon_mla_wgmma.flat_serves(num_heads, BLOCK_H):
        mid_out, mid_lse = decode_scratch(1, num_heads, rank, gluon_mla_wgmma.flat_slots(bs, WGMMA_PROGRAMS),
                                          q.device, scratch, partial_dtype, any_splits=True)
    else:
        mid_out, mid_lse = decode_scratch(bs, num_heads, rank, num_kv_splits, q.device, scratch, partial_dtype)
    head_blocks = cdiv(num_heads, BLOCK_H)
    counters = tickets(q.device, bs * head_blocks) if fused else mid_lse  # unread unless fused
    lanes = merge_lanes or max(2, next_power_of_2(num_kv_splits))
    slice_d = min(merge_slice or _merge_slice(buffers, fused, lanes), block_r)
    merge_launch = {"PDL": False} if fused else dependent_launch(q.device)
    if wgmma:
        if not gluon_mla_wgmma.launch_stage1(q, latent_cache, mid_out, mid_lse, out, counters if fused else None,
                                             req_to_token, req_pool_indices, seq_lens, sm_scale * LOG2_E, BLOCK_H,
                                             num_kv_splits, min_keys, WGMMA_PROGRAMS, trace, memo=memo):
            # This Triton refused it: again with gluon_mla's stage 1 at the chunks asked for.
            mla_decode_attention(q, latent_cache, out, req_to_token, req_pool_indices, seq_lens, sm_scale,
                                 num_kv_splits, scratch, tiles, fused_merge, trace, asked_partials, min_chunk,
                                 merge_lanes, buffers, merge_slice, score_chains, wgmma=False)
            return
    elif buffers:
        if not gluon_mla.launch_stage1(q, latent_cache, mid_out, mid_lse, out, counters if fused else None,
                                       req_to_token, req_pool_indices, seq_lens, sm_scale * LOG2_E, BLOCK_H,
                                       num_kv_splits, min_keys, block_n, buffers, num_warps, slice_d,
                                       score_chains):
            # This Triton refused it: again with this module's stage 1 and its own settings.
            mla_decode_attention(q, latent_cache, out, req_to_token, req_pool_indices, seq_lens, sm_scale,
                                 num_kv_splits, scratch, fused_merge=fused_merge, min_chunk=min_chunk,
                                 merge_lanes=merge_lanes, buffers=0, merge_slice=merge_slice)
            return
    else:
        _MLA_STAGE1.launch(
            (bs, head_blocks, num_kv_splits), q, latent_cache, mid_out, mid_lse, out, counters,
            req_to_token, req_pool_indices, seq_lens, sm_scale * LOG2_E, mid_lse if trace is None else trace,
            q.stride(0), q.stride(1), latent_cache.stride(0), req_to_token.stride(0),
            mid_out.stride(0), mid_out.stride(1), mid_out.stride(2), mid_lse.stride(0), mid_lse.stride(1),
            out.stride(0), out.stride(1),
            NUM_HEADS=num_heads, RANK=rank, ROPE=rope, BLOCK_R=block_r, BLOCK_P=block_p,
            BLOCK_H=BLOCK_H, BLOCK_N=block_n, NUM_SPLITS=num_kv_splits, MIN_CHUNK=min_keys,
            FUSED_MERGE=fused, MERGE_D=slice_d, TRACE=trace is not None, RELEASE=merge_launch["PDL"],
            num_warps=num_warps, num_stages=num_stages,
        )
    if fused:
        return
    _MLA_MERGE.launch(
        (bs, num_heads, cdiv(rank, slice_d)), mid_out, mid_lse, out, seq_lens,
        mid_out.stride(0), mid_out.stride(1), mid_out.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1),
        RANK=rank, BLOCK_D=slice_d, BLOCK_N=block_n, NUM_SPLITS=num_kv_splits, MIN_CHUNK=min_keys,
        LANES=lanes, **merge_launch,
        num_warps=4, num_stages=1,
    )


def mla_extend_attention(
    q: torch.Tensor,  # [num_tokens, heads, rank + rope]
    latent_cache: torch.Tensor,  # [num_slots, 1, rank + rope], new tokens already stored
    out: torch.Tensor,  # [num_tokens, heads, rank], written in place
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
    extend_prefix_lens: torch.Tensor, extend_seq_lens: torch.Tensor, extend_start_loc: torch.Tensor,
    sm_scale: float, max_extend_len: int, tiles: tuple[int, int, int, int] | None = None,
    longest_keys: int = 0, new_tokens: int | None = None, kv_splits: int | None = None,
    heads: int | None = None,
) -> None:
    """`triton_extend.extend_attention` over the latent pool, its rows and keys laid out the
    same way (`longest_keys`, `new_tokens`, `kv_splits`, `heads`: every head shares the one
    latent head, so a small step's program takes up to SMALL_EXTEND of them); `tiles`
    overrides EXTEND_TILES, the query block included (benchmarks)."""
    large_block_m, block_n, num_warps, num_stages = tiles or EXTEND_TILES
    rank, rope, block_r, block_p = _layout(q, latent_cache, out, req_to_token)
    num_tokens, num_heads = q.shape[0], q.shape[1]
    heads, block_m, blocks, kv_splits = extend_launch(
        num_heads, num_heads, req_pool_indices.shape[0], max_extend_len, longest_keys, sm_count(q.device),
        large_block_m, heads or (1 if tiles else None), kv_splits, tiles[0] if tiles else None,
    )
    mid_o = mid_lse = out  # unread with one split
    if kv_splits > 1:
        mid_o, mid_lse = split_scratch(num_tokens, num_heads, block_r, kv_splits, q.device)
    # Heads vary fastest: the programs of one query block read the same latent rows from L2.
    _MLA_EXTEND.launch(
        (num_heads // heads, req_pool_indices.shape[0], blocks * kv_splits), q,
        latent_cache, out, mid_o, mid_lse, req_to_token, req_pool_indices, extend_prefix_lens, extend_seq_lens,
        extend_start_loc, sm_scale * LOG2_E,
        q.stride(0), q.stride(1), latent_cache.stride(0), out.stride(0), out.stride(1),
        req_to_token.stride(0), mid_o.stride(0), mid_o.stride(1), mid_lse.stride(0), mid_lse.stride(1), kv_splits,
        RANK=rank, ROPE=rope, BLOCK_R=block_r, BLOCK_P=block_p, BLOCK_M=block_m,
        BLOCK_N=block_n, SPLIT=kv_splits > 1, HEADS=heads, num_warps=num_warps, num_stages=num_stages,
    )
    if kv_splits > 1:
        merge_splits(mid_o, mid_lse, out, num_tokens if new_tokens is None else new_tokens, rank, block_r,
                     kv_splits)
