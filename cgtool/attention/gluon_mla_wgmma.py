"""MLA decode's stage 1 on Hopper's warpgroup MMA, keys as the MMA's rows (Triton's Gluon dialect).

gluon_mla's stage 1 runs `mma_v2`: each of its 4 warps loads the whole query (16 heads x 576)
from shared memory into registers again for every tile of 32 keys, and its own 8 keys' rows,
so a tile moves about 180 KB through shared memory. At two programs an SM that is about 1.5
us a 32-key tile a program, the step that docs/moe-mla.md section 5 found constant however
many copies were in flight. Here one warpgroup issues `wgmma`, whose operands are read from
shared memory once for the whole group and never pass through registers:

- scores transposed, S^T = rows . q^T: the tile's 64 keys are the MMA's M (16 a warp), the 16
  heads its N, so one head block needs no padding;
- the output transposed, O^T += rows^T . P^T: the rank's 512 columns are M, the heads N; P^T
  goes to shared memory as the MMA's B operand.

A tile of 64 keys then moves about 250 KB through shared memory (its copies, the rows read
twice, q and P^T), 70% of the mma_v2 kernel's per key. Two tiles of rows (147 KB) and q fill
an SM, one program each; triton_mla.wgmma_serves says where that is faster. The softmax holds
one maximum for a chunk's tiles (FIXED_MAX), so a tile has no reduction across its warps; the
rare chunk whose scores leave that maximum's range is done again with a running one.

Partials and tickets are gluon_mla's, the merge its `_merge_heads` a group of chunks at a time
(`_merge_chunks`, MERGE_GROUP). The chunks are not gluon_mla's: a request gets chunks in
proportion to its share of the batch's key tiles, so that the working programs fill the SMs
once whatever the batch's lengths and padding (`_shared_chunk_keys`); the last program of a
request's chunks merges them; a request of one chunk writes its output at once. The programs
are mapped to the batch's (request, chunk) pairs flat (FLAT_CHUNKS): WGMMA_PROGRAMS + bs of them
(under the projection's merge, mla_merge_projection.plan_programs + bs), each reading its own
from the step's plan (mla_flat_plan, one kernel a forward), so no request's share is capped; the
few past the last chunk leave at once. Up to
mla_merge_projection.MAX_BS requests nothing here merges: the value projection's kernel,
released at this kernel's start (RELEASE_AT_START), reads each request's first slot and chunk
count from the same plan and merges the partials as it loads them.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import triton

from cgtool.attention import gluon_mla, redone_chunks
from cgtool.attention.mla_flat_plan import ENTRY, FlatPlan, flat_plan
from cgtool.runtime.dependent_launch import dependent_launch
from cgtool.runtime.gpu_class import is_h200
from cgtool.runtime.triton_launch import cdiv

gluon = gluon_mla.gluon
# The compiler's message once this process's Triton refused the kernel (launch_stage1).
_REFUSED: list[str] = []
# Keys a tile (the MMA's M for one warpgroup), tiles of rows in shared memory, warps. Three
# tiles of rank parts, with the rope parts loaded into registers a tile ahead, were 20-50%
# slower at every shape (H200, benchmarks/results/h200-2026-11-27-wgmma-mla, call 3).
WGMMA_TILES = (64, 2, 4)
BLOCK_H = 16  # heads a program: the MMA's N
# Chunks the last program's merge loads at once: 1.0-1.2 us a layer less than 8 (bs 24-48 x 1k,
# H100, benchmarks/probe_merge_group.py); 2 and 1 within 0.3 us of 4.
MERGE_GROUP = 4
# q's loads issued ahead of the first tile's slots (True) or after them (False); None, as
# shipped: by the GPU class (`q_first`), ahead on the H200 only. With the running maximum ahead
# was 0.1-0.5 us a layer shorter on the H200 (bs 17-96 x 1k, bs 32 x 8k) but on the H100 0.2-0.4
# longer at bs 32-40 x 1k, where the target was closest, and 0.5 shorter at bs 48 (three
# alternating rounds each, benchmarks/results/h200-h100-2026-11-27-mla-tail, calls 3-4); with
# the merge in the value projection 0.1-0.3 us longer on both GPUs at bs 24-64 x 1k
# (benchmarks/results/h200-h100-2026-11-27-stage1-settings, calls 2-3). The merge in one pass
# (a group's log-sum-exps loaded beside its partials) was no faster (call 1 of the first).
# With the fixed maximum (FIXED_MAX) ahead was 0.1-0.5 us shorter on the H200 at all 15 shapes
# timed, bs 16-64 x 1k to 32 x 8k, with the same bits (calls 11-12 of
# benchmarks/results/h200-2026-11-28-mla-fixed-max); the H100 was not lent to time it again.
Q_FIRST: bool | None = None
# Partial outputs' values a thread stores and the merge loads at once: 8 (16-byte accesses in
# bf16) against 4, three alternating rounds (benchmarks/results/h200-h100-2026-11-27-mla-tail,
# calls 6-7): H200 0.0-0.4 us a layer shorter at bs 17-48 x 1k and 1.4-1.5 at bs 96; H100 from
# 0.1 longer to 0.4 shorter at bs 17-48 x 1k, 0.2-0.3 shorter at bs 32 x 8k.
PARTIAL_VEC = 8
# A request of one chunk writes its output at once (True), with no partial, ticket or merge; its
# bits are the merge's, which rounds the one partial to the output's dtype as this does. H100,
# bs 96 / 128 x 1k: 49.5 / 60.9 us a layer merged, 47.5 / 57.2 written at once (two alternating
# rounds, benchmarks/results/h100-h200-2026-11-27-mla-spares, call 2; H200 38.2 / 44.7 against
# 35.1 / 41.2, call 6); fewer chunks unchanged.
ONE_CHUNK_DIRECT = True
# Spare chunks (the grid's, past a request's own count) launched first (True) or last (False):
# last was 0.1-1.6 us a layer shorter at every shape, bs 17-128 x 1k and bs 16 x 8k (three
# alternating rounds, H100, same folder, call 3); on the H200 0.2-1.0 us shorter at bs 17-32, 96
# and 128, 0.3 longer at bs 48 (call 6). First, the spares took the SMs before the working
# chunks and delayed their start by about 0.9 us. Only the grid mapping has them: with
# FLAT_CHUNKS the few programs past the last chunk come last in the launch anyway.
SPARES_FIRST = False
# The grid's programs mapped to the batch's (request, chunk) pairs in one flat run (True): a
# grid of WGMMA_PROGRAMS + bs programs, each reading its (request, chunk) from the step's plan
# (mla_flat_plan), a request's partials in consecutive slots of one [1, heads, programs + bs,
# rank] scratch.
# Uncapped by num_kv_splits, so a long request among short ones takes the programs its keys ask
# for; and the spares are at most bs, not bs x num_kv_splits less the working chunks. Else the
# grid (bs, head blocks, num_kv_splits) as before. A batch of equal lengths gets the same chunks
# and bits either way. Alternating rounds (benchmarks/results/h200-h100-2026-11-27-mla-flat):
# 40 x 300 keys + 1 x 16,000 took 34.0 us a layer against 77.2 on the H200 (call 5) and 37.0
# against 76.2 on the H100 (call 6); 30 x 1,024 + 2 x 8,192 26.2 against 36.6 and 32.5 against
# 38.9. At equal lengths the running sum each program then ran cost 0.0-0.3 us on the H200 (bs
# 17-128 x 1k, bs 32 x 8k) and on the H100 0.6-0.7 at bs 32-40 x 1k, 0.7 less at bs 48; the plan
# once a forward since (with the projection's merge reading it before its wait) took 0.3-1.3 us a
# layer off on the H200 and 0.8-1.1 at bs 17-24 on the H100, within 0.3 elsewhere
# (benchmarks/results/h200-h100-2026-11-27-mla-flat-plan).
FLAT_CHUNKS = True
# The first tile's slots and copies issued before the wait on the step's store (True), which
# releases this kernel at its start: only the request's newest key is the store's, so a chunk
# whose first tile ends before it need not wait to start reading. False, as shipped: the wait
# comes first. Early copies were 0.3-0.7 us a layer slower at bs 17-64 x 1k and bs 32 x 8k, with
# the same bits (H200, five alternating rounds, the store in the graph;
# benchmarks/results/h200-2026-11-27-mla-early-copies).
EARLY_COPIES = False
# Unmerged, the projection's kernel released at stage 1's start (True) rather than after each
# program's loop: its grid is launched while stage 1 runs, and its programs are placed as SMs
# free up, load their weights and wait there for stage 1's end. Not where the plan kernel came
# just before (the projection reads the plan before its wait). H200, five alternating rounds,
# 27 layers a graph (benchmarks/results/h200-h100-2026-11-27-mla-flat-plan, call 6): 0.3-1.5 us
# a layer shorter at bs 17-64 x 1k (bs 32 56% -> 60%, bs 40 57% -> 62%), 0.9 at 32 x 8k.
RELEASE_AT_START = True
# The first tile's slots (req_to_token, which the step's store does not write) read before the
# wait on the store (True), its copies after it; False: the wait first. True was 0.0-0.5 us a
# layer shorter at bs 8-64 x 1k-4k, 32 x 8k and a skewed batch on both GPUs, and nowhere longer
# (five alternating rounds, 27 layers a graph; H200 calls 1, 2 and 5, H100 call 7 of
# benchmarks/results/h200-h100-2026-11-27-mla-merge-slots). Its copies too before the wait:
# EARLY_COPIES.
SLOTS_EARLY = True
# Benchmarks only, wrong bits when False: stage 1's loop without its row copies (COPIES) or
# without its products and softmax (PRODUCTS), bounds on where its time goes
# (benchmarks/probe_mla_projection.py settings wg.COPIES=0, wg.PRODUCTS=0).
COPIES = True
PRODUCTS = True
# Each chunk's tiles scaled by one fixed maximum, 0 (True), not a running one (False): no
# maximum across the warps and no rescale of the output a tile. Floating point does not mind the
# scale, only its range, and the check of that range is free: the rows' running sums of p,
# kept anyway, summed per head, must lie within [2^FIXED_LOW, 2^FIXED_HIGH] (scores, in log2
# units, from about -47 to +51; p stays far inside fp32's and bf16's range). A chunk whose sums
# do not is done again with a running maximum. Against the running maximum, up to 0.9 us a layer
# shorter at 23 shapes of bs 1-64 at 1k-8k, none more than 0.03 us longer (H200,
# benchmarks/results/h200-2026-11-28-mla-fixed-max). A chunk done twice costs about a second
# stage 1 (6.5-20.7 us a layer at bs 17-64 x 1k where every chunk was, call 5 there).
# CGTOOL_MLA_FIXED_MAX=0 turns it off for a process: for weights whose capture counts many
# chunks redone (SizeResult.mla_chunks_redone), or to time both ways.
FIXED_MAX = os.environ.get("CGTOOL_MLA_FIXED_MAX", "1") != "0"
FIXED_LOW = -60.0
FIXED_HIGH = 64.0
# Each chunk done again adds one to the device's counter (redone_chunks), which `capture` reports
# a decode size; False only to time the count against nothing (benchmarks).
COUNT_REDONE = True

if gluon is not None:
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    from cgtool.attention.gluon_mla import (
        _copy_rows,
        _load_slots,
        _release_next_kernel,
        _wait_for_previous_kernel,
        async_copy,
        cta_barrier,
        gl,
    )
    from cgtool.runtime.kernel_trace import gluon_sm_id, gluon_stamp_after, gluon_trace_store

    @gluon.jit
    def _scores_t(q_r, q_p, kv, pe, start_n, end, scale_log2, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr,
                  mma: gl.constexpr):
        """A tile's scores, transposed [keys, heads], in log2 units; -inf past `end`."""
        zero = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, mma)
        s = warpgroup_mma(kv, q_r.permute((1, 0)), zero, use_acc=False, is_async=True)
        s = warpgroup_mma(pe, q_p.permute((1, 0)), s, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, mma))
        return gl.where((offs_n < end)[:, None], s * scale_log2, float("-inf"))

    @gluon.jit
    def _add_values_t(acc_t, p, kv, p_smem):
        """acc^T [rank, heads] plus the tile's rows weighed by p [keys, heads], through shared memory."""
        p_smem.store(p.to(p_smem.dtype))
        fence_async_shared()
        cta_barrier()  # every warp's part of P^T is written before the MMA reads it
        acc_t = warpgroup_mma(kv.permute((1, 0)), p_smem, acc_t, is_async=True)
        return warpgroup_mma_wait(num_outstanding=0, deps=(acc_t,))

    @gluon.jit
    def _attend_tile_t(acc_t, l_t, m_i, q_r, q_p, kv, pe, p_smem, start_n, end, scale_log2,
                       BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, mma: gl.constexpr):
        """One online-softmax step, transposed: scores [keys, heads], output [rank, heads].
        `l_t` keeps each key row's running sum of p, added over the keys only at the end, so a
        tile takes one reduction across warps (the max), not two."""
        s = _scores_t(q_r, q_p, kv, pe, start_n, end, scale_log2, BLOCK_H, BLOCK_N, mma)
        m_new = gl.maximum(m_i, gl.max(s, 0))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s - m_new[None, :])
        l_t = l_t * alpha[None, :] + p
        return _add_values_t(acc_t * alpha[None, :], p, kv, p_smem), l_t, m_new

    @gluon.jit
    def _attend_tile_fixed_t(acc_t, l_t, m_i, q_r, q_p, kv, pe, p_smem, start_n, end, scale_log2,
                             BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, mma: gl.constexpr):
        """`_attend_tile_t` against a maximum `m_i` held for the chunk (FIXED_MAX): no reduction
        across warps and no rescale; p may pass 1."""
        p = gl.exp2(_scores_t(q_r, q_p, kv, pe, start_n, end, scale_log2, BLOCK_H, BLOCK_N, mma) - m_i[None, :])
        return _add_values_t(acc_t, p, kv, p_smem), l_t + p

    @gluon.jit
    def _next_tile(Kv, kv_bufs, pe_bufs, next_slots, token_row, i, start, end, stride_kt, RANK: gl.constexpr,
                   ROPE: gl.constexpr, BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr, COPIES: gl.constexpr,
                   copy_layout: gl.constexpr, slot_layout: gl.constexpr):
        """Step i's copies of the tile NUM_BUF - 1 ahead, the slots of the one after, and the wait
        for tile i's rows; the slots loaded, for the next step."""
        cta_barrier()  # every warp is done with the buffer read last step before it is refilled
        ahead = start + (i + NUM_BUF - 1) * BLOCK_N
        fill = (i + NUM_BUF - 1) % NUM_BUF
        if COPIES:
            _copy_rows(Kv, kv_bufs.index(fill), pe_bufs.index(fill), next_slots, ahead, end, stride_kt,
                       RANK, ROPE, BLOCK_N, copy_layout)
        next_slots = _load_slots(token_row, ahead + BLOCK_N, end, BLOCK_N, slot_layout)
        async_copy.wait_group(NUM_BUF - 1)
        # The copies (and q's stores) are the generic proxy's; the MMA reads through the async one.
        fence_async_shared()
        cta_barrier()
        return next_slots

    @gluon.jit
    def _first_copies(Kv, kv_bufs, pe_bufs, token_row, start, end, stride_kt, RANK: gl.constexpr,
                      ROPE: gl.constexpr, BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr, COPIES: gl.constexpr,
                      copy_layout: gl.constexpr, slot_layout: gl.constexpr):
        """A second pass's copies of the chunk's first NUM_BUF - 1 tiles; the slots of the next."""
        for j in gl.static_range(NUM_BUF - 1):
            if COPIES:
                _copy_rows(Kv, kv_bufs.index(j), pe_bufs.index(j),
                           _load_slots(token_row, start + j * BLOCK_N, end, BLOCK_N, slot_layout),
                           start + j * BLOCK_N, end, stride_kt, RANK, ROPE, BLOCK_N, copy_layout)
        return _load_slots(token_row, start + (NUM_BUF - 1) * BLOCK_N, end, BLOCK_N, slot_layout)

    @gluon.jit
    def _tile_loop(acc_t, l_t, m_i, q_r, q_p, Kv, kv_bufs, pe_bufs, p_smem, next_slots, token_row, start, end,
                   scale_log2, stride_kt, RANK: gl.constexpr, ROPE: gl.constexpr, BLOCK_H: gl.constexpr,
                   BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr, COPIES: gl.constexpr, PRODUCTS: gl.constexpr,
                   FIXED: gl.constexpr, mma: gl.constexpr, copy_layout: gl.constexpr, slot_layout: gl.constexpr):
        """The chunk's tiles, the first NUM_BUF - 1 copies issued, scaled by the fixed maximum
        `m_i` (FIXED) or a running one from it: (acc^T, the rows' sums of p, the maximum)."""
        for i in range(gl.cdiv(end - start, BLOCK_N)):
            next_slots = _next_tile(Kv, kv_bufs, pe_bufs, next_slots, token_row, i, start, end, stride_kt, RANK,
                                    ROPE, BLOCK_N, NUM_BUF, COPIES, copy_layout, slot_layout)
            if PRODUCTS:
                if FIXED:
                    acc_t, l_t = _attend_tile_fixed_t(acc_t, l_t, m_i, q_r, q_p, kv_bufs.index(i % NUM_BUF),
                                                      pe_bufs.index(i % NUM_BUF), p_smem, start + i * BLOCK_N, end,
                                                      scale_log2, BLOCK_H, BLOCK_N, mma)
                else:
                    acc_t, l_t, m_i = _attend_tile_t(acc_t, l_t, m_i, q_r, q_p, kv_bufs.index(i % NUM_BUF),
                                                     pe_bufs.index(i % NUM_BUF), p_smem, start + i * BLOCK_N, end,
                                                     scale_log2, BLOCK_H, BLOCK_N, mma)
        async_copy.wait_group(0)
        return acc_t, l_t, m_i

    @gluon.jit
    def _attend_chunk_t(Q, Kv, token_row, b, head_block, start, end, scale_log2, stride_qb, stride_qh, stride_kt,
                        NUM_HEADS: gl.constexpr, RANK: gl.constexpr, ROPE: gl.constexpr, BLOCK_H: gl.constexpr,
                        BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr, Q_FIRST: gl.constexpr,
                        WAIT: gl.constexpr = False, seq_len=0, WAIT_AFTER_SLOTS: gl.constexpr = False,
                        COPIES: gl.constexpr = True, PRODUCTS: gl.constexpr = True,
                        FIXED_MAX: gl.constexpr = False, FIXED_LOW: gl.constexpr = 0.0,
                        FIXED_HIGH: gl.constexpr = 0.0, Redone=None, COUNT_REDONE: gl.constexpr = True):
        """(acc^T [rank, heads], l [heads], m [heads]) over keys start..end - 1, scaled by a
        running maximum, or (FIXED_MAX) by 0 and done again with a running one where the sums of
        p leave [FIXED_LOW, FIXED_HIGH], each such chunk counted at Redone. Q_FIRST: q's
        loads issued before the first tile's slots, so that their round trips overlap. WAIT:
        this waits on the kernel before (the store of each request's newest key, seq_len - 1):
        after the first tile's copies where that tile ends before the newest key, else first.
        WAIT_AFTER_SLOTS: this waits on it after the first tile's slots, before any copy."""
        if WAIT:  # noqa: SIM102 (a constexpr alone: when false, nothing of the branch is built)
            if start + BLOCK_N >= seq_len:
                _wait_for_previous_kernel()
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BLOCK_H, 16])
        copy_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        slot_layout: gl.constexpr = gl.SliceLayout(1, copy_layout)
        dtype: gl.constexpr = Kv.dtype.element_ty
        # 128-byte swizzle: the rank and rope parts' rows are whole multiples of 128 bytes.
        rows: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        kv_bufs = gl.allocate_shared_memory(dtype, [NUM_BUF, BLOCK_N, RANK], rows)
        pe_bufs = gl.allocate_shared_memory(dtype, [NUM_BUF, BLOCK_N, ROPE], rows)
        heads = head_block * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, copy_layout))
        q_rows = Q + b * stride_qb + heads[:, None] * stride_qh
        mask_h = (heads < NUM_HEADS)[:, None]
        offs_r = gl.arange(0, RANK, layout=gl.SliceLayout(0, copy_layout))
        offs_p = gl.arange(0, ROPE, layout=gl.SliceLayout(0, copy_layout))
        if Q_FIRST:
            q_r_val = gl.load(q_rows + offs_r[None, :], mask=mask_h, other=0.0)
            q_p_val = gl.load(q_rows + RANK + offs_p[None, :], mask=mask_h, other=0.0)
        for j in gl.static_range(NUM_BUF - 1):
            slots = _load_slots(token_row, start + j * BLOCK_N, end, BLOCK_N, slot_layout)
            if WAIT_AFTER_SLOTS:  # noqa: SIM102 (constexprs alone, as above)
                if j == 0:
                    _wait_for_previous_kernel()
            if COPIES:
                _copy_rows(Kv, kv_bufs.index(j), pe_bufs.index(j), slots, start + j * BLOCK_N, end, stride_kt,
                           RANK, ROPE, BLOCK_N, copy_layout)
        next_slots = _load_slots(token_row, start + (NUM_BUF - 1) * BLOCK_N, end, BLOCK_N, slot_layout)
        if WAIT:  # noqa: SIM102 (as above)
            if start + BLOCK_N < seq_len:
                _wait_for_previous_kernel()
        if not Q_FIRST:
            q_r_val = gl.load(q_rows + offs_r[None, :], mask=mask_h, other=0.0)
            q_p_val = gl.load(q_rows + RANK + offs_p[None, :], mask=mask_h, other=0.0)
        q_r = gl.allocate_shared_memory(dtype, [BLOCK_H, RANK],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_H, RANK], dtype), q_r_val)
        q_p = gl.allocate_shared_memory(dtype, [BLOCK_H, ROPE],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_H, ROPE], dtype), q_p_val)
        p_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_H],
                                           gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_H], dtype))

        acc_t = gl.zeros([RANK, BLOCK_H], gl.float32, mma)
        l_t = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, mma)
        if FIXED_MAX:
            m_i = gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(0, mma))
        else:
            m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(0, mma))
        acc_t, l_t, m_i = _tile_loop(acc_t, l_t, m_i, q_r, q_p, Kv, kv_bufs, pe_bufs, p_smem, next_slots, token_row,
                                     start, end, scale_log2, stride_kt, RANK, ROPE, BLOCK_H, BLOCK_N, NUM_BUF, COPIES,
                                     PRODUCTS, FIXED_MAX, mma, copy_layout, slot_layout)
        l_i = gl.sum(l_t, 0)
        if FIXED_MAX:  # noqa: SIM102 (a constexpr alone: when false, nothing of the branch is built)
            if gl.max(((l_i > FIXED_HIGH) | (l_i < FIXED_LOW)).to(gl.int32), 0) != 0:  # out of range: again
                if COUNT_REDONE:
                    gl.atomic_add(Redone, 1, sem="relaxed", scope="gpu")
                cta_barrier()  # every warp is done with the first pass's buffers
                next_slots = _first_copies(Kv, kv_bufs, pe_bufs, token_row, start, end, stride_kt, RANK, ROPE,
                                           BLOCK_N, NUM_BUF, COPIES, copy_layout, slot_layout)
                acc_t, l_t, m_i = _tile_loop(
                    gl.zeros([RANK, BLOCK_H], gl.float32, mma), gl.zeros([BLOCK_N, BLOCK_H], gl.float32, mma),
                    gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(0, mma)), q_r, q_p, Kv, kv_bufs,
                    pe_bufs, p_smem, next_slots, token_row, start, end, scale_log2, stride_kt, RANK, ROPE, BLOCK_H,
                    BLOCK_N, NUM_BUF, COPIES, PRODUCTS, False, mma, copy_layout, slot_layout)
                l_i = gl.sum(l_t, 0)
        return acc_t, l_i, m_i

    @gluon.jit
    def _store_rows_t(Dst, acc_t, l_i, head_block, stride_h,
                      NUM_HEADS: gl.constexpr, RANK: gl.constexpr, BLOCK_H: gl.constexpr, VEC: gl.constexpr):
        """The normalised output [heads, rank] from its transpose, at Dst + head * stride_h."""
        out_layout: gl.constexpr = gl.BlockedLayout([VEC, 1], [32, 1], [1, 4], [0, 1])
        part = gl.convert_layout((acc_t / l_i[None, :]).to(Dst.dtype.element_ty), out_layout)
        heads = head_block * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(0, out_layout))
        offs_d = gl.arange(0, RANK, layout=gl.SliceLayout(1, out_layout))
        gl.store(Dst + heads[None, :] * stride_h + offs_d[:, None], part, mask=(heads < NUM_HEADS)[None, :])

    @gluon.jit
    def _store_partial_t(MidOut, MidLse, acc_t, l_i, m_i, b, head_block, split,
                         stride_mb, stride_mh, stride_ms, stride_lb, stride_lh,
                         NUM_HEADS: gl.constexpr, RANK: gl.constexpr, BLOCK_H: gl.constexpr, VEC: gl.constexpr):
        """The chunk's normalised output [heads, rank] from its transpose, and its base-2 log-sum-exp."""
        _store_rows_t(MidOut + b * stride_mb + split * stride_ms, acc_t, l_i, head_block, stride_mh,
                      NUM_HEADS, RANK, BLOCK_H, VEC)
        lse_heads = head_block * BLOCK_H + gl.arange(0, BLOCK_H, layout=l_i.type.layout)
        gl.store(MidLse + b * stride_lb + lse_heads * stride_lh + split, m_i + gl.log2(l_i),
                 mask=lse_heads < NUM_HEADS)

    @gluon.jit
    def _merge_chunks(MidOut, MidLse, O, b, head_block, chunks,
                      stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ob, stride_oh,
                      NUM_HEADS: gl.constexpr, RANK: gl.constexpr, BLOCK_H: gl.constexpr, GROUP: gl.constexpr,
                      VEC: gl.constexpr):
        """gluon_mla._merge_heads over the request's `chunks` chunks, GROUP of them unrolled at a
        time: unrolled over every chunk the grid allows (up to 15) the kernel took 247 registers
        a thread."""
        layout: gl.constexpr = gl.BlockedLayout([1, VEC], [2, 16], [4, 1], [1, 0])
        heads = head_block * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, layout))
        mask_h = heads < NUM_HEADS
        lse_ptrs = MidLse + b * stride_lb + heads * stride_lh
        lse_max = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(1, layout))
        for g in range(0, chunks, GROUP):
            for j in gl.static_range(GROUP):
                used = mask_h & (gl.full([BLOCK_H], g + j, gl.int32, gl.SliceLayout(1, layout)) < chunks)
                lse_max = gl.maximum(lse_max, gl.load(lse_ptrs + g + j, mask=used, other=float("-inf"),
                                                      cache_modifier=".cg"))
        lse_max = gl.where(mask_h, lse_max, 0.0)
        offs_d = gl.arange(0, RANK, layout=gl.SliceLayout(0, layout))
        acc = gl.zeros([BLOCK_H, RANK], gl.float32, layout)
        total = gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(1, layout))
        for g in range(0, chunks, GROUP):
            for j in gl.static_range(GROUP):
                used = mask_h & (gl.full([BLOCK_H], g + j, gl.int32, gl.SliceLayout(1, layout)) < chunks)
                lse = gl.load(lse_ptrs + g + j, mask=used, other=float("-inf"), cache_modifier=".cg")
                weight = gl.where(used, gl.exp2(lse - lse_max), 0.0)
                part = gl.load(MidOut + b * stride_mb + heads[:, None] * stride_mh + (g + j) * stride_ms
                               + offs_d[None, :], mask=used[:, None], other=0.0, cache_modifier=".cg")
                acc += part.to(gl.float32) * weight[:, None]
                total += weight
        merged = acc / gl.where(total > 0, total, 1.0)[:, None]
        gl.store(O + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :], merged.to(O.dtype.element_ty),
                 mask=mask_h[:, None])

    @gluon.jit
    def _shared_chunk_keys(seq_lens, seq_len, batch, programs, NUM_SPLITS: gl.constexpr, BLOCK_N: gl.constexpr,
                           MIN_CHUNK: gl.constexpr, BATCH_BLOCK: gl.constexpr):
        """Keys a chunk of this request: `programs` programs shared among the batch's requests in
        proportion to their whole key tiles (at least one chunk, at most NUM_SPLITS), so short
        requests take one program and none a long one could use. Whole tiles only, so that a
        replay's padding (one key a request) shares them as the batch alone does."""
        layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        offs = gl.arange(0, BATCH_BLOCK, layout=layout)
        lens = gl.load(seq_lens + offs, mask=offs < batch, other=0)
        whole = gl.maximum(gl.sum(lens // BLOCK_N, 0), 1)
        chunks = gl.minimum(gl.maximum(programs * (seq_len // BLOCK_N) // whole, 1), NUM_SPLITS)
        return gl.maximum(gl.cdiv(gl.cdiv(seq_len, BLOCK_N), chunks) * BLOCK_N, MIN_CHUNK)

    @gluon.jit
    def _flat_entry(Entries, program, ENTRY: gl.constexpr):
        """(request, its chunk, its chunks, its first slot, keys a chunk, its length, its pool
        row) of flat program `program`, from the step's plan (mla_flat_plan); a spare's request
        is the batch's size. Volatile, so that the seven loads are issued together and none is
        sunk into a branch below, one memory round trip later."""
        row = Entries + program * ENTRY
        return (gl.load(row, volatile=True), gl.load(row + 1, volatile=True), gl.load(row + 2, volatile=True),
                gl.load(row + 3, volatile=True), gl.load(row + 4, volatile=True), gl.load(row + 5, volatile=True),
                gl.load(row + 6, volatile=True))

    @gluon.jit
    def _grid_chunk(seq_lens, req_pool_indices, programs, NUM_SPLITS: gl.constexpr, BLOCK_N: gl.constexpr,
                    MIN_CHUNK: gl.constexpr, BATCH_BLOCK: gl.constexpr, SPARES_FIRST: gl.constexpr):
        """`_flat_entry`'s fields for a program of the grid (bs, head blocks, NUM_SPLITS): its
        request is the grid's row, its chunk the grid's column, the partials in its request's row
        from slot 0. SPARES_FIRST: chunk indices in reverse launch order, so the grid's last, past
        most requests' own count, go out first and leave at once (before waiting on the store),
        and trail no launch. Else in launch order: the working chunks take the SMs first and the
        spares leave on SMs that are free or done."""
        b = gl.program_id(0)
        split = gl.num_programs(2) - 1 - gl.program_id(2) if SPARES_FIRST else gl.program_id(2)
        seq_len = gl.load(seq_lens + b)
        pool_row = gl.load(req_pool_indices + b, volatile=True)  # beside the length: see gluon_mla
        keys = _shared_chunk_keys(seq_lens, seq_len, gl.num_programs(0), programs, NUM_SPLITS, BLOCK_N, MIN_CHUNK,
                                  BATCH_BLOCK)
        chunks = gl.maximum(gl.cdiv(seq_len, gl.maximum(keys, 1)), 1)
        return b, split, chunks, 0, keys, seq_len, pool_row

    @gluon.jit
    def _ticket_then_merge(MidOut, MidLse, O, Tickets, b, head_block, chunks,
                           stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ob, stride_oh,
                           NUM_HEADS: gl.constexpr, RANK: gl.constexpr, BLOCK_H: gl.constexpr,
                           MERGE_GROUP: gl.constexpr, PARTIAL_VEC: gl.constexpr, Trace, program,
                           TRACE: gl.constexpr):
        """Request b's ticket, once this chunk's partial is stored; its last chunk to draw one
        merges the `chunks` partials from MidOut / MidLse (the request's first) into O (its row)."""
        cta_barrier()
        ticket = Tickets + b * gl.num_programs(1) + head_block
        drawn = gl.atomic_add(ticket, 1, sem="acq_rel", scope="gpu")
        if TRACE:
            gluon_trace_store(Trace, program, 4, gluon_stamp_after(drawn))
        if drawn == chunks - 1:
            gl.atomic_xchg(ticket, 0, sem="relaxed", scope="gpu")
            _merge_chunks(MidOut, MidLse, O, 0, head_block, chunks, stride_mb, stride_mh, stride_ms, stride_lb,
                          stride_lh, stride_ob, stride_oh, NUM_HEADS, RANK, BLOCK_H, MERGE_GROUP, PARTIAL_VEC)
            if TRACE:
                gluon_trace_store(Trace, program, 5, gluon_stamp_after(drawn))

    @gluon.jit
    def _mla_decode_stage1_wgmma(
        Q, Kv, MidOut, MidLse, O, Tickets, req_to_token, req_pool_indices, seq_lens, scale_log2,
        stride_qb, stride_qh, stride_kt, stride_req, stride_mb, stride_mh, stride_ms, stride_lb, stride_lh,
        stride_ob, stride_oh,
        NUM_HEADS: gl.constexpr, RANK: gl.constexpr, ROPE: gl.constexpr, BLOCK_H: gl.constexpr,
        BLOCK_N: gl.constexpr, NUM_SPLITS: gl.constexpr, MIN_CHUNK: gl.constexpr, NUM_BUF: gl.constexpr,
        FUSED_MERGE: gl.constexpr, MERGE_GROUP: gl.constexpr, PDL: gl.constexpr, programs,
        BATCH_BLOCK: gl.constexpr, Trace, TRACE: gl.constexpr, Q_FIRST: gl.constexpr, PARTIAL_VEC: gl.constexpr,
        ONE_CHUNK_DIRECT: gl.constexpr, SPARES_FIRST: gl.constexpr, FLAT: gl.constexpr, Entries,
        ENTRY: gl.constexpr, ENTRY_AFTER_WAIT: gl.constexpr, UNMERGED: gl.constexpr,
        EARLY_COPIES: gl.constexpr = False, RELEASE_AT_START: gl.constexpr = False,
        SLOTS_EARLY: gl.constexpr = False, COPIES: gl.constexpr = True, PRODUCTS: gl.constexpr = True,
        FIXED_MAX: gl.constexpr = False, FIXED_LOW: gl.constexpr = 0.0, FIXED_HIGH: gl.constexpr = 0.0,
        Redone=None, COUNT_REDONE: gl.constexpr = True,
    ):
        head_block = gl.program_id(1)
        # TRACE (benchmarks/probe_mla_timeline.py): the SM, then stamps at the start, once the
        # chunk's keys are known (after the wait on the store), after the loop, after the
        # ticket, after the merge; a spare chunk stamps its start only.
        program = (gl.program_id(0) * gl.num_programs(1) + head_block) * gl.num_programs(2) + gl.program_id(2)
        if TRACE:
            gluon_trace_store(Trace, program, 0, gluon_sm_id(program))
            gluon_trace_store(Trace, program, 1, gluon_stamp_after(program))
        if PDL and UNMERGED:  # noqa: SIM102 (constexprs alone: when false, nothing is built)
            if RELEASE_AT_START:
                _release_next_kernel()
        if FLAT:
            # grid (programs + bs,): the partials of request b's chunks in slots first.. of row 0
            batch = gl.num_programs(0) - programs
            if PDL:  # noqa: SIM102 (a constexpr alone: when false, nothing of the branch is built)
                if ENTRY_AFTER_WAIT:  # the plan kernel, just before, is the kernel this one follows
                    _wait_for_previous_kernel()
            b, split, chunks, first, keys, seq_len, pool_row = _flat_entry(Entries, gl.program_id(0), ENTRY)
            working = b < batch
            part_row = 0
        else:
            b, split, chunks, first, keys, seq_len, pool_row = _grid_chunk(
                seq_lens, req_pool_indices, programs, NUM_SPLITS, BLOCK_N, MIN_CHUNK, BATCH_BLOCK, SPARES_FIRST)
            working = split < chunks
            part_row = b
        if working:
            start = split * keys
            end = gl.minimum(start + keys, seq_len)
            # Constexprs tested alone: Triton 3.9 refused a constexpr or'd with a runtime test.
            if PDL:
                if EARLY_COPIES:
                    if end <= start:  # else _attend_chunk_t waits
                        _wait_for_previous_kernel()
                elif SLOTS_EARLY:
                    if end <= start:  # as above
                        _wait_for_previous_kernel()
                else:
                    _wait_for_previous_kernel()
            # An empty chunk (a zero length) still takes the ticket path, as before. Triton 3.6
            # failed to lower the mask with a false constexpr folded into it, hence two branches.
            if ONE_CHUNK_DIRECT and FUSED_MERGE:
                direct = (chunks == 1) & (end > start)
            else:
                direct = chunks < 0  # never
            if TRACE:
                gluon_trace_store(Trace, program, 2, gluon_stamp_after(end))
            if end > start:
                token_row = req_to_token + pool_row.to(gl.int64) * stride_req
                acc_t, l_i, m_i = _attend_chunk_t(Q, Kv, token_row, b, head_block, start, end, scale_log2,
                                                  stride_qb, stride_qh, stride_kt,
                                                  NUM_HEADS, RANK, ROPE, BLOCK_H, BLOCK_N, NUM_BUF, Q_FIRST,
                                                  PDL and EARLY_COPIES, seq_len,
                                                  PDL and SLOTS_EARLY, COPIES, PRODUCTS, FIXED_MAX, FIXED_LOW,
                                                  FIXED_HIGH, Redone, COUNT_REDONE)
                if TRACE:
                    gluon_trace_store(Trace, program, 3, gluon_stamp_after(gl.sum(l_i, 0)))
                if PDL and UNMERGED:  # noqa: SIM102 (as above)
                    if not RELEASE_AT_START:
                        _release_next_kernel()  # the projection's programs load their weights meanwhile
                if direct:
                    _store_rows_t(O + b * stride_ob, acc_t, l_i, head_block, stride_oh, NUM_HEADS, RANK, BLOCK_H,
                                  PARTIAL_VEC)
                else:
                    _store_partial_t(MidOut, MidLse, acc_t, l_i, m_i, part_row, head_block, first + split,
                                     stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, NUM_HEADS, RANK,
                                     BLOCK_H, PARTIAL_VEC)
            if FUSED_MERGE and not direct:
                # The request's first partial, log-sum-exp and output row, as row 0 of each.
                _ticket_then_merge(MidOut + part_row * stride_mb + first * stride_ms,
                                   MidLse + part_row * stride_lb + first, O + b * stride_ob,
                                   Tickets, b, head_block, chunks,
                                   stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ob, stride_oh,
                                   NUM_HEADS, RANK, BLOCK_H, MERGE_GROUP, PARTIAL_VEC, Trace, program, TRACE)


def flat_serves(num_heads: int, block_h: int = BLOCK_H) -> bool:
    """Whether launch_stage1 maps its programs flat by default (FLAT_CHUNKS, one head block)."""
    return FLAT_CHUNKS and cdiv(num_heads, block_h) == 1


def flat_slots(batch_size: int, programs: int) -> int:
    """Partial slots a flat launch over `batch_size` requests needs: one a program."""
    return programs + batch_size


def q_first(device: torch.device) -> bool:
    """Q_FIRST where it is set, else by the GPU class: ahead on the H200 only."""
    if Q_FIRST is not None:
        return Q_FIRST
    if device.type != "cuda":
        return False
    return is_h200(torch.cuda.current_device() if device.index is None else device.index)


def fixed_max_constants() -> dict[str, bool | float]:
    """The kernel's FIXED_MAX constexprs from the module's settings, its range as sums of p."""
    return {"FIXED_MAX": FIXED_MAX, "FIXED_LOW": 2.0**FIXED_LOW, "FIXED_HIGH": 2.0**FIXED_HIGH}


def counts_redone(device: torch.device) -> bool:
    """Whether this kernel can serve MLA decode on `device` with the fixed maximum, counting
    the chunks it does twice (redone_chunks)."""
    return bool(FIXED_MAX and COUNT_REDONE) and not _REFUSED and gluon_mla.available(device)


def refused() -> bool:
    """Whether this process's Triton refused to compile the kernel (then gluon_mla's serves)."""
    return bool(_REFUSED)


def launch_stage1(
    q: torch.Tensor, latent_cache: torch.Tensor, mid_out: torch.Tensor, mid_lse: torch.Tensor, out: torch.Tensor,
    tickets: torch.Tensor | None, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor, scale_log2: float, block_h: int, num_kv_splits: int, min_chunk: int, programs: int,
    trace: torch.Tensor | None = None, flat: bool | None = None, plan: FlatPlan | None = None,
    memo: dict[object, Any] | None = None,
) -> bool:
    """gluon_mla.launch_stage1's contract (partials, tickets, dependent launch) with
    WGMMA_TILES and `block_h` BLOCK_H: the batch's key tiles are shared among `programs`
    programs in proportion to each request's (one an SM). `flat` (default `flat_serves`): a grid
    of `programs` + bs programs, one head block, partials in `flat_slots` slots of
    mid_out [1, heads, slots, rank] and mid_lse [1, heads, slots], each program's request and
    chunk read from the step's `plan` (`mla_flat_plan.flat_plan`, planned here from `memo` when
    not given); else the grid (bs, head blocks, `num_kv_splits`), at most that many chunks a
    request, partials as gluon_mla's. False, having launched nothing, where this Triton refuses
    to compile the kernel; from then on `refused` says so, with one RuntimeWarning. `trace`
    (int64, TRACE_SLOTS a program of the grid) takes the programs' timestamps (benchmarks).
    Flat and without tickets nothing merges: mla_merge_projection.merge_project does, from the
    plan's requests, released once each program's loop is done."""
    block_n, num_buf, num_warps = WGMMA_TILES
    bs, num_heads, width = q.shape
    rank = out.shape[-1]
    flat = flat_serves(num_heads, block_h) if flat is None else flat
    if flat:
        assert cdiv(num_heads, block_h) == 1, "flat chunks serve one head block"
        assert mid_lse.shape[-1] >= flat_slots(bs, programs), "one partial slot a flat program"
        plan = plan or flat_plan(seq_lens, req_pool_indices, programs, min_chunk, block_n, memo)
    assert plan is None or flat, "a plan is the flat launch's"
    grid = (programs + bs, 1, 1) if flat else (bs, cdiv(num_heads, block_h), num_kv_splits)
    assert trace is None or trace.shape[0] >= grid[0] * grid[1] * grid[2], "a trace row for every program"
    return gluon_mla.launch_or_refuse(
        _mla_decode_stage1_wgmma, grid, _REFUSED, "gluon_mla_wgmma", "gluon_mla",
        q, latent_cache, mid_out, mid_lse, out, tickets, req_to_token, req_pool_indices, seq_lens, scale_log2,
        NUM_HEADS=num_heads, RANK=rank, ROPE=width - rank, BLOCK_H=block_h, BLOCK_N=block_n,
        # One compile for every flat launch: their programs take chunks from the plan, so
        # NUM_SPLITS (varying with the batch size) is not read, and `programs` is a runtime
        # argument (plan_programs varies it too). As constexprs each value was a compile of its
        # own: a cold capture of deepseek-v2-lite's 33 plan sizes compiled this kernel 46 times,
        # now 4, and took 58 s, now 29 (H200, 2026-11-28).
        NUM_SPLITS=1 if flat else num_kv_splits, MIN_CHUNK=min_chunk, NUM_BUF=num_buf,
        FUSED_MERGE=tickets is not None, MERGE_GROUP=MERGE_GROUP, programs=programs,
        BATCH_BLOCK=max(32 * num_warps, triton.next_power_of_2(bs)),
        Trace=mid_lse if trace is None else trace, TRACE=trace is not None, Q_FIRST=q_first(q.device),
        PARTIAL_VEC=PARTIAL_VEC, ONE_CHUNK_DIRECT=ONE_CHUNK_DIRECT, SPARES_FIRST=SPARES_FIRST, FLAT=flat,
        Entries=mid_lse if plan is None else plan.entries, ENTRY=ENTRY, ENTRY_AFTER_WAIT=bool(plan and plan.fresh),
        UNMERGED=tickets is None, EARLY_COPIES=EARLY_COPIES,
        SLOTS_EARLY=SLOTS_EARLY and not EARLY_COPIES, COPIES=COPIES, PRODUCTS=PRODUCTS,
        **fixed_max_constants(), Redone=redone_chunks.counter(q.device), COUNT_REDONE=COUNT_REDONE,
        # Not after the plan kernel: the projection reads the plan before its wait.
        RELEASE_AT_START=RELEASE_AT_START and not (plan and plan.fresh), num_warps=num_warps,
        **dependent_launch(q.device),
    )
