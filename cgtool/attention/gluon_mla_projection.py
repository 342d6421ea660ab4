"""MLA decode's merge in the value projection as a Gluon kernel, its weights copied to shared
memory while it waits for stage 1 (mla_merge_projection.GLUON_KERNEL).

mla_merge_projection's Triton kernel loads each program's 64 rows of the head's up-projection
(64 KB) into registers and stores them to shared memory before its wait on stage 1: Triton 3.6
puts a product's operand in shared memory right after the load that feeds it. The programs
placed last start as stage 1's slowest programs leave, so they read their weights after the
wait has long been over; a variant that never read them was 0.4-1.0 us a layer shorter on the
H100 (benchmarks/results/h100-2026-11-27-mla-weights-bound), and loading them after the wait
was slower (h200-2026-11-27-mla-weights-after). Here asynchronous copies issued at the program's
start take the weights from global to shared memory, waited on only before the product, so
their read overlaps the wait and the merge.

The merge is the Triton kernel's, per program:
- rows of up to four chunks elementwise in chunk order (`_merge_four`), so that a row's sum
  depends on its own chunks alone and a padded replay gives the rows of the batch run alone;
- else over the program's partial slots, transposed as stage 1's products are: each step's
  partials [SLOTS, rank] and the slots' weights in their rows [SLOTS, rows] (two bf16 parts) go
  to shared memory, and one warpgroup MMA adds partials^T . weights to the running [rank, rows]
  sum.
Then the product: the weights [64, rank] times the merged rows^T [rank, rows]. The outputs had
the Triton kernel's bits at 8 of the 10 shapes timed (H200, call 11 of
benchmarks/results/h200-h100-2026-11-27-mla-gluon-projection; at 24 and 64 x 1k they differed
by rounding).

Where a program's slots fit one step (PROJECT_FIRST, `_project_one_step`), the product comes
first: the weights times each slot's partial (W . part^T [64, slots], kept as two bf16 parts),
then weighed into the rows by the slots' weights and divided by each row's total. The merged
rows then never go through shared memory, and the large product waits only for the partials,
not for the merge's own products: stamped at bs 16 x 1k on the H100, the layer's last program
ended 4.64 us after stage 1's last loop, against 5.09 (call 13 of
benchmarks/results/h100-h200-2026-11-27-mla-step-and-trials). The rows are not rounded to bf16
between the merge and the product there, so the outputs differ from the Triton kernel's by that
rounding. Where they fit two steps (WIDE_STEP, `_project_two_steps`), both steps' loads are
issued together and each step is projected first into its own buffers.
"""

from __future__ import annotations

import torch

from cgtool.attention import gluon_mla
from cgtool.runtime.dependent_launch import dependent_launch
from cgtool.runtime.triton_launch import cdiv

# Partial slots a step and warps (two warpgroups: the merge's [rank, rows] sum split over them by
# rank, the product by rows; with one, 255 registers a thread and a spill).
SLOTS, WARPS = 32, 8

if gluon_mla.gluon is not None:
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    from cgtool.attention.gluon_mla import (
        _wait_for_previous_kernel,
        async_copy,
        copy_to_shared,
        cta_barrier,
        gl,
        gluon,
    )
    from cgtool.runtime.kernel_trace import gluon_sm_id, gluon_stamp_after, gluon_trace_store

    @gluon.jit
    def _load_step(out_head, lse_head, first, ends, s0, hi, stride_ms, RANK: gl.constexpr, SLOTS: gl.constexpr,
                   copy_layout: gl.constexpr, slot_layout: gl.constexpr):
        """Slots s0..s0 + SLOTS - 1 below hi: their partials [SLOTS, rank] and each slot's base-2
        log-sum-exp in its request's row [SLOTS, rows] (-inf elsewhere)."""
        slots_c = s0 + gl.arange(0, SLOTS, layout=gl.SliceLayout(1, copy_layout))
        offs_r = gl.arange(0, RANK, layout=gl.SliceLayout(0, copy_layout))
        part = gl.load(out_head + slots_c[:, None] * stride_ms + offs_r[None, :], mask=(slots_c < hi)[:, None],
                       other=0.0, cache_modifier=".cg")
        slots = s0 + gl.arange(0, SLOTS, layout=gl.SliceLayout(1, slot_layout))
        lse = gl.load(lse_head + slots, mask=slots < hi, other=float("-inf"), cache_modifier=".cg")
        mine = (slots[:, None] >= first[None, :]) & (slots[:, None] < ends[None, :])
        return part, gl.where(mine, lse[:, None], float("-inf"))

    @gluon.jit
    def _store_step(part, weights, part_s, high_s, low_s):
        """A step's partials and its slots' weights (two bf16 parts) into shared memory. A slot no
        request names weighs nought, but may hold a value that is not finite: stored as nought."""
        part_s.store(gl.where(gl.abs(part) < float("inf"), part, 0.0))
        high = weights.to(high_s.dtype)
        high_s.store(high)
        low_s.store((weights - high.to(gl.float32)).to(low_s.dtype))

    @gluon.jit
    def _stage_step(total, m_i, out_head, lse_head, first, ends, s0, hi, stride_ms, part_s, high_s, low_s,
                    RANK: gl.constexpr, SLOTS: gl.constexpr, copy_layout: gl.constexpr,
                    slot_layout: gl.constexpr, Trace, program, TRACE: gl.constexpr):
        """Slots s0..s0 + SLOTS - 1 below hi into shared memory: their partials [SLOTS, rank] and
        each slot's weight in its request's row [SLOTS, rows] (two bf16 parts, against the
        running max). (alpha, the rescale of what came before, the running total and max.)"""
        slots_c = s0 + gl.arange(0, SLOTS, layout=gl.SliceLayout(1, copy_layout))
        offs_r = gl.arange(0, RANK, layout=gl.SliceLayout(0, copy_layout))
        part = gl.load(out_head + slots_c[:, None] * stride_ms + offs_r[None, :], mask=(slots_c < hi)[:, None],
                       other=0.0, cache_modifier=".cg")
        # A slot no request names weighs nought, but may hold a value that is not finite.
        part = gl.where(gl.abs(part) < float("inf"), part, 0.0)
        slots = s0 + gl.arange(0, SLOTS, layout=gl.SliceLayout(1, slot_layout))
        lse = gl.load(lse_head + slots, mask=slots < hi, other=float("-inf"), cache_modifier=".cg")
        mine = (slots[:, None] >= first[None, :]) & (slots[:, None] < ends[None, :])
        scores = gl.where(mine, lse[:, None], float("-inf"))  # [SLOTS, rows]
        m_new = gl.maximum(m_i, gl.max(scores, 0))
        safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - safe)
        weights = gl.exp2(scores - safe[None, :])
        total = total * alpha + gl.sum(weights, 0)
        high = weights.to(part_s.dtype)
        low = (weights - high.to(gl.float32)).to(part_s.dtype)
        cta_barrier()  # every warp's MMAs of the last step are done with the buffers
        part_s.store(part)
        high_s.store(high)
        low_s.store(low)
        fence_async_shared()
        cta_barrier()
        if TRACE:  # the step's partials loaded and stored to shared memory (the last step's)
            gluon_trace_store(Trace, program, 6, gluon_stamp_after(s0))
        return alpha, total, m_new

    @gluon.jit
    def _merge_step(acc_t, total, m_i, out_head, lse_head, first, ends, s0, hi, stride_ms, part_s, high_s, low_s,
                    RANK: gl.constexpr, SLOTS: gl.constexpr, copy_layout: gl.constexpr,
                    slot_layout: gl.constexpr, mma: gl.constexpr, Trace, program, TRACE: gl.constexpr):
        """The running merge (acc^T [rank, rows], total, max) with slots s0..s0 + SLOTS - 1 below hi."""
        alpha, total, m_new = _stage_step(total, m_i, out_head, lse_head, first, ends, s0, hi, stride_ms, part_s,
                                          high_s, low_s, RANK, SLOTS, copy_layout, slot_layout, Trace, program,
                                          TRACE)
        acc_t = acc_t * gl.convert_layout(alpha, gl.SliceLayout(0, mma))[None, :]
        acc_t = warpgroup_mma(part_s.permute((1, 0)), high_s, acc_t, is_async=True)
        acc_t = warpgroup_mma(part_s.permute((1, 0)), low_s, acc_t, is_async=True)
        acc_t = warpgroup_mma_wait(num_outstanding=0, deps=(acc_t,))
        if TRACE:  # its products done
            gluon_trace_store(Trace, program, 7, gluon_stamp_after(s0))
        return acc_t, total, m_new

    @gluon.jit
    def _weigh_slots(p_hi_s, p_lo_s, high_s, low_s, BLOCK_V: gl.constexpr, BLOCK_M: gl.constexpr,
                     product: gl.constexpr):
        """One step's per-slot products [columns, slots] weighed into the rows: [columns, rows]
        in fp32, the three products of two bf16 parts that matter."""
        o_t = warpgroup_mma(p_hi_s, high_s, gl.zeros([BLOCK_V, BLOCK_M], gl.float32, product), use_acc=False,
                            is_async=True)
        o_t = warpgroup_mma(p_hi_s, low_s, o_t, is_async=True)
        o_t = warpgroup_mma(p_lo_s, high_s, o_t, is_async=True)
        return warpgroup_mma_wait(num_outstanding=0, deps=(o_t,))

    @gluon.jit
    def _store_parts(p_hi_s, p_lo_s, per_slot):
        """A step's per-slot products as two bf16 parts, for the products that weigh them."""
        high = per_slot.to(p_hi_s.dtype)
        p_hi_s.store(high)
        p_lo_s.store((per_slot - high.to(gl.float32)).to(p_lo_s.dtype))

    @gluon.jit
    def _project_one_step(out_head, lse_head, first, ends, lo, hi, stride_ms, part_s, high_s, low_s, w_s, p_hi_s,
                          p_lo_s, RANK: gl.constexpr, BLOCK_V: gl.constexpr, BLOCK_M: gl.constexpr,
                          SLOTS: gl.constexpr, copy_layout: gl.constexpr, slot_layout: gl.constexpr,
                          product: gl.constexpr, Trace, program, TRACE: gl.constexpr):
        """A program's slots, SLOTS or fewer, projected before they are weighed: each slot's
        partial times the weights (W . part^T [columns, slots], in two bf16 parts), then weighed
        into its request's row and divided by the row's total: o^T [columns, rows] in fp32. The
        merged rows never go through shared memory, and the large product waits for no merge."""
        slots_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                               instr_shape=[16, SLOTS // 2, 16])
        m0 = gl.full([BLOCK_M], float("-inf"), gl.float32, gl.SliceLayout(0, slot_layout))
        t0 = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(0, slot_layout))
        _, total, _ = _stage_step(t0, m0, out_head, lse_head, first, ends, lo, hi, stride_ms, part_s, high_s, low_s,
                                  RANK, SLOTS, copy_layout, slot_layout, Trace, program, TRACE)
        async_copy.wait_group(0)  # the weights
        fence_async_shared()
        cta_barrier()
        per_slot = warpgroup_mma(w_s, part_s.permute((1, 0)), gl.zeros([BLOCK_V, SLOTS], gl.float32, slots_layout),
                                 use_acc=False, is_async=True)
        per_slot = warpgroup_mma_wait(num_outstanding=0, deps=(per_slot,))
        if TRACE:
            gluon_trace_store(Trace, program, 7, gluon_stamp_after(lo))
        _store_parts(p_hi_s, p_lo_s, per_slot)
        fence_async_shared()
        cta_barrier()
        o_t = _weigh_slots(p_hi_s, p_lo_s, high_s, low_s, BLOCK_V, BLOCK_M, product)
        if TRACE:
            gluon_trace_store(Trace, program, 4, gluon_stamp_after(hi))
        total_o = gl.convert_layout(total, gl.SliceLayout(0, product))
        return o_t / gl.where(total_o > 0, total_o, 1.0)[None, :]

    @gluon.jit
    def _project_two_steps(out_head, lse_head, first, ends, lo, hi, stride_ms, part_bufs, high_s, low_s, high2_s,
                           low2_s, w_s, p_hi_s, p_lo_s, p_hi2_s, p_lo2_s, RANK: gl.constexpr, BLOCK_V: gl.constexpr,
                           BLOCK_M: gl.constexpr, SLOTS: gl.constexpr, copy_layout: gl.constexpr,
                           slot_layout: gl.constexpr, product: gl.constexpr, Trace, program, TRACE: gl.constexpr):
        """`_project_one_step` for a program of SLOTS + 1 to 2 * SLOTS slots (WIDE_STEP): both steps'
        loads issued together (one round trip to L2, not two), their weights against one max,
        each step projected into its own buffers, then both weighed into the rows."""
        slots_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                               instr_shape=[16, SLOTS // 2, 16])
        part_1, scores_1 = _load_step(out_head, lse_head, first, ends, lo, hi, stride_ms, RANK, SLOTS, copy_layout,
                                      slot_layout)
        part_2, scores_2 = _load_step(out_head, lse_head, first, ends, lo + SLOTS, hi, stride_ms, RANK, SLOTS,
                                      copy_layout, slot_layout)
        top = gl.maximum(gl.max(scores_1, 0), gl.max(scores_2, 0))
        safe = gl.where(top == float("-inf"), 0.0, top)
        weights_1 = gl.exp2(scores_1 - safe[None, :])
        weights_2 = gl.exp2(scores_2 - safe[None, :])
        total = gl.sum(weights_1, 0) + gl.sum(weights_2, 0)
        _store_step(part_1, weights_1, part_bufs.index(0), high_s, low_s)
        _store_step(part_2, weights_2, part_bufs.index(1), high2_s, low2_s)
        async_copy.wait_group(0)  # the weights
        fence_async_shared()
        cta_barrier()
        if TRACE:
            gluon_trace_store(Trace, program, 6, gluon_stamp_after(lo))
        zeros = gl.zeros([BLOCK_V, SLOTS], gl.float32, slots_layout)
        per_1 = warpgroup_mma(w_s, part_bufs.index(0).permute((1, 0)), zeros, use_acc=False, is_async=True)
        per_2 = warpgroup_mma(w_s, part_bufs.index(1).permute((1, 0)), zeros, use_acc=False, is_async=True)
        per_1, per_2 = warpgroup_mma_wait(num_outstanding=0, deps=(per_1, per_2))
        if TRACE:
            gluon_trace_store(Trace, program, 7, gluon_stamp_after(lo))
        _store_parts(p_hi_s, p_lo_s, per_1)
        _store_parts(p_hi2_s, p_lo2_s, per_2)
        fence_async_shared()
        cta_barrier()
        o_t = _weigh_slots(p_hi_s, p_lo_s, high_s, low_s, BLOCK_V, BLOCK_M, product)
        o_t += _weigh_slots(p_hi2_s, p_lo2_s, high2_s, low2_s, BLOCK_V, BLOCK_M, product)
        if TRACE:
            gluon_trace_store(Trace, program, 4, gluon_stamp_after(hi))
        total_o = gl.convert_layout(total, gl.SliceLayout(0, product))
        return o_t / gl.where(total_o > 0, total_o, 1.0)[None, :]

    @gluon.jit
    def _product(w_s, rows_t, product: gl.constexpr, BLOCK_V: gl.constexpr, BLOCK_M: gl.constexpr):
        """The weights [columns, rank] times merged rows^T [rank, rows] in shared memory, once the
        weights' copy is in: o^T [columns, rows] in fp32."""
        async_copy.wait_group(0)
        fence_async_shared()
        cta_barrier()
        o_t = warpgroup_mma(w_s, rows_t, gl.zeros([BLOCK_V, BLOCK_M], gl.float32, product), use_acc=False,
                            is_async=True)
        return warpgroup_mma_wait(num_outstanding=0, deps=(o_t,))

    @gluon.jit
    def _chunk(out_head, lse_head, first, chunks, c: gl.constexpr, stride_ms, offs_r):
        """Each row's partial of its chunk c, transposed [rank, rows] (zeros past its chunks), and
        its log-sum-exp [rows] (-inf past them)."""
        part = gl.load(out_head + (first + c)[None, :] * stride_ms + offs_r[:, None], mask=(c < chunks)[None, :],
                       other=0.0, cache_modifier=".cg")
        lse = gl.load(lse_head + first + c, mask=c < chunks, other=float("-inf"), cache_modifier=".cg")
        return part, lse

    @gluon.jit
    def _merge_four(out_head, lse_head, first, chunks, stride_ms, RANK: gl.constexpr, layout: gl.constexpr):
        """Rows of at most four chunks, merged elementwise in chunk order as the Triton kernel's
        `_weigh` merges them: a row's sum depends on its own chunks alone, so that a padded
        replay's rows are the bits of the same rows run alone. (merged^T [rank, rows], fp32.)"""
        offs_r = gl.arange(0, RANK, layout=gl.SliceLayout(1, layout))
        p0, l0 = _chunk(out_head, lse_head, first, chunks, 0, stride_ms, offs_r)
        p1, l1 = _chunk(out_head, lse_head, first, chunks, 1, stride_ms, offs_r)
        p2, l2 = _chunk(out_head, lse_head, first, chunks, 2, stride_ms, offs_r)
        p3, l3 = _chunk(out_head, lse_head, first, chunks, 3, stride_ms, offs_r)
        top = gl.maximum(gl.maximum(l0, l1), gl.maximum(l2, l3))
        safe = gl.where(top == float("-inf"), 0.0, top)
        w0, w1 = gl.exp2(l0 - safe), gl.exp2(l1 - safe)
        w2, w3 = gl.exp2(l2 - safe), gl.exp2(l3 - safe)
        acc = p0.to(gl.float32) * w0[None, :]
        acc += p1.to(gl.float32) * w1[None, :]
        acc += p2.to(gl.float32) * w2[None, :]
        acc += p3.to(gl.float32) * w3[None, :]
        total = w0 + w1 + w2 + w3
        return acc / gl.where(total > 0, total, 1.0)[None, :]

    @gluon.jit
    def _merge_slots(out_head, lse_head, first, ends, lo, hi, stride_ms, part_bufs, high_s, low_s, m_s,
                     RANK: gl.constexpr, BLOCK_M: gl.constexpr, SLOTS: gl.constexpr, copy_layout: gl.constexpr,
                     slot_layout: gl.constexpr, mma: gl.constexpr, Trace, program, TRACE: gl.constexpr):
        """The merge over the program's slots lo..hi - 1, SLOTS a step, its two buffers of partials
        taken in turn; the merged rows^T [rank, rows] stored to m_s in its dtype."""
        acc_t = gl.zeros([RANK, BLOCK_M], gl.float32, mma)
        total = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(0, slot_layout))
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, gl.SliceLayout(0, slot_layout))
        for i in range(gl.cdiv(hi - lo, SLOTS)):
            acc_t, total, m_i = _merge_step(acc_t, total, m_i, out_head, lse_head, first, ends, lo + i * SLOTS,
                                            hi, stride_ms, part_bufs.index(i % 2), high_s, low_s, RANK, SLOTS,
                                            copy_layout, slot_layout, mma, Trace, program, TRACE)
        total_t = gl.convert_layout(total, gl.SliceLayout(0, mma))
        m_s.store((acc_t / gl.where(total_t > 0, total_t, 1.0)[None, :]).to(m_s.dtype))

    @gluon.jit
    def _store_rows(Out, o_t, head, batch, requests_a_program, stride_ot, V: gl.constexpr, BLOCK_V: gl.constexpr,
                    BLOCK_M: gl.constexpr, product: gl.constexpr):
        """The product o^T [columns, rows] into Out's rows, from the MMA's layout (16-byte stores
        of a row were no faster, H200 call 10 of the folder named in mla_merge_projection)."""
        cols = gl.program_id(1) * BLOCK_V + gl.arange(0, BLOCK_V, layout=gl.SliceLayout(1, product))
        lanes = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, product))
        rows = gl.program_id(2) * requests_a_program + lanes
        gl.store(Out + rows[None, :] * stride_ot + head * V + cols[:, None], o_t.to(Out.dtype.element_ty),
                 mask=((rows < batch) & (lanes < requests_a_program))[None, :])

    @gluon.jit
    def _merge_project_kernel(
        MidOut, MidLse, Requests, W, Out, batch, requests_a_program,
        stride_mh, stride_ms, stride_lh, stride_wh, stride_wv, stride_ot, Trace,
        RANK: gl.constexpr, V: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_V: gl.constexpr, SLOTS: gl.constexpr,
        PDL: gl.constexpr, TRACE: gl.constexpr = False, PROJECT_FIRST: gl.constexpr = True,
        WIDE_STEP: gl.constexpr = True,
    ):
        head = gl.program_id(0)
        # TRACE: the Triton kernel's stamps (start, plan loaded, wait returned, merged, multiplied),
        # and in the merge over slots its last step's partials stored to shared memory and its
        # products done (6, 7).
        program = (head * gl.num_programs(1) + gl.program_id(1)) * gl.num_programs(2) + gl.program_id(2)
        if TRACE:
            gluon_trace_store(Trace, program, 0, gluon_sm_id(program))
            gluon_trace_store(Trace, program, 1, gluon_stamp_after(program))
        dtype: gl.constexpr = W.dtype.element_ty
        copy_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
        slot_layout: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [1, 8], [0, 1])  # [SLOTS, rows]
        # [rank, rows] with the rank contiguous: 16-byte loads of a row's partial.
        four_layout: gl.constexpr = gl.BlockedLayout([8, 1], [32, 1], [1, 8], [0, 1])
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                      instr_shape=[16, BLOCK_M, 16])
        # The product's [64 columns, rows]: 64 rows are one warpgroup's, so the rows split.
        product: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                          instr_shape=[16, BLOCK_M // 2, 16])
        swizzled: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        # The weights, which do not depend on stage 1: copied while it finishes, waited on last.
        w_s = gl.allocate_shared_memory(dtype, [BLOCK_V, RANK], swizzled)
        offs_v = gl.program_id(1) * BLOCK_V + gl.arange(0, BLOCK_V, layout=gl.SliceLayout(1, copy_layout))
        offs_r = gl.arange(0, RANK, layout=gl.SliceLayout(0, copy_layout))
        copy_to_shared(w_s, W + head * stride_wh + offs_v[:, None] * stride_wv + offs_r[None, :])
        async_copy.commit_group()
        # The step's plan, written before stage 1 ran: each row's first slot and chunk count.
        lanes = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, slot_layout))
        rows = gl.program_id(2) * requests_a_program + lanes
        in_batch = (rows < batch) & (lanes < requests_a_program)
        first = gl.load(Requests + 2 * rows, mask=in_batch, other=0)
        ends = first + gl.load(Requests + 2 * rows + 1, mask=in_batch, other=0)
        lo = gl.min(gl.where(ends > first, first, 2147483647), 0)
        hi = gl.max(gl.where(ends > first, ends, 0), 0)
        if TRACE:
            gluon_trace_store(Trace, program, 2, gluon_stamp_after(hi - lo))
        if PDL:
            _wait_for_previous_kernel()
        if TRACE:
            gluon_trace_store(Trace, program, 3, gluon_stamp_after(program))
        # Two buffers of partials, taken in turn: also 132 KB of shared memory a program, so that
        # one program runs an SM (at 100 KB two shared an SM, on half the SMs: 1-3 us slower).
        part_bufs = gl.allocate_shared_memory(dtype, [2, SLOTS, RANK], swizzled)
        step_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([SLOTS, BLOCK_M], dtype)
        high_s = gl.allocate_shared_memory(dtype, [SLOTS, BLOCK_M], step_layout)
        low_s = gl.allocate_shared_memory(dtype, [SLOTS, BLOCK_M], step_layout)
        # The merged rows, the product's right operand: transposed from the merge over slots, as
        # rows (each thread's rank elements contiguous, 16-byte stores) from the four-chunk merge.
        m_s = gl.allocate_shared_memory(dtype, [RANK, BLOCK_M], gl.NVMMASharedLayout.get_default_for([RANK, BLOCK_M],
                                                                                                     dtype))
        rows_s = gl.allocate_shared_memory(dtype, [BLOCK_M, RANK],
                                           gl.NVMMASharedLayout.get_default_for([BLOCK_M, RANK], dtype))
        # The per-slot products of the weights (PROJECT_FIRST), two bf16 parts.
        per_slot_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_V, SLOTS], dtype)
        p_hi_s = gl.allocate_shared_memory(dtype, [BLOCK_V, SLOTS], per_slot_layout)
        p_lo_s = gl.allocate_shared_memory(dtype, [BLOCK_V, SLOTS], per_slot_layout)
        # And the second step's where two steps are projected first (WIDE_STEP).
        p_hi2_s = gl.allocate_shared_memory(dtype, [BLOCK_V, SLOTS], per_slot_layout)
        p_lo2_s = gl.allocate_shared_memory(dtype, [BLOCK_V, SLOTS], per_slot_layout)
        high2_s = gl.allocate_shared_memory(dtype, [SLOTS, BLOCK_M], step_layout)
        low2_s = gl.allocate_shared_memory(dtype, [SLOTS, BLOCK_M], step_layout)
        out_head = MidOut + head * stride_mh
        lse_head = MidLse + head * stride_lh
        # Rounded to the weights' dtype where the separate merge rounded its output (but for one
        # step projected first).
        four = gl.max(ends - first, 0) <= 4
        if four:
            rows_four: gl.constexpr = gl.SliceLayout(0, four_layout)
            merged = _merge_four(out_head, lse_head, gl.convert_layout(first, rows_four),
                                 gl.convert_layout(ends - first, rows_four), stride_ms, RANK, four_layout)
            rows_s.store(merged.to(dtype).permute((1, 0)))
            if TRACE:
                gluon_trace_store(Trace, program, 4, gluon_stamp_after(hi))
            o_t = _product(w_s, rows_s.permute((1, 0)), product, BLOCK_V, BLOCK_M)
        elif PROJECT_FIRST and hi - lo <= SLOTS:
            o_t = _project_one_step(out_head, lse_head, first, ends, lo, hi, stride_ms, part_bufs.index(0), high_s,
                                    low_s, w_s, p_hi_s, p_lo_s, RANK, BLOCK_V, BLOCK_M, SLOTS, copy_layout,
                                    slot_layout, product, Trace, program, TRACE)
        elif PROJECT_FIRST and WIDE_STEP and hi - lo <= 2 * SLOTS:
            o_t = _project_two_steps(out_head, lse_head, first, ends, lo, hi, stride_ms, part_bufs, high_s, low_s,
                                     high2_s, low2_s, w_s, p_hi_s, p_lo_s, p_hi2_s, p_lo2_s, RANK, BLOCK_V, BLOCK_M,
                                     SLOTS, copy_layout, slot_layout, product, Trace, program, TRACE)
        else:
            _merge_slots(out_head, lse_head, first, ends, lo, hi, stride_ms, part_bufs, high_s, low_s, m_s, RANK,
                         BLOCK_M, SLOTS, copy_layout, slot_layout, mma, Trace, program, TRACE)
            if TRACE:
                gluon_trace_store(Trace, program, 4, gluon_stamp_after(hi))
            o_t = _product(w_s, m_s, product, BLOCK_V, BLOCK_M)
        if TRACE:
            gluon_trace_store(Trace, program, 5, gluon_stamp_after(gl.sum(gl.sum(o_t, 1), 0)))
        _store_rows(Out, o_t, head, batch, requests_a_program, stride_ot, V, BLOCK_V, BLOCK_M, product)


def merge_project(mid_out: torch.Tensor, mid_lse: torch.Tensor, requests: torch.Tensor, w_uv: torch.Tensor,
                  out: torch.Tensor, block_m: int, block_v: int, per_program: int,
                  trace: torch.Tensor | None = None, project_first: bool = True, wide_step: bool = True) -> None:
    """mla_merge_projection.merge_project's contract, on this kernel: `per_program` requests a
    program in rows of `block_m`, `block_v` value columns a program (its grid, the Triton kernel's);
    `trace` takes the Triton kernel's stamps."""
    heads, v, rank = w_uv.shape
    bs = requests.shape[0]
    grid = (heads, cdiv(v, block_v), cdiv(bs, per_program))
    _merge_project_kernel[grid](
        mid_out, mid_lse, requests, w_uv, out, bs, per_program,
        mid_out.stride(1), mid_out.stride(2), mid_lse.stride(1), w_uv.stride(0), w_uv.stride(1), out.stride(0),
        requests if trace is None else trace, TRACE=trace is not None, RANK=rank, V=v, BLOCK_M=block_m,
        BLOCK_V=block_v, SLOTS=SLOTS, PROJECT_FIRST=project_first, WIDE_STEP=wide_step, num_warps=WARPS,
        **dependent_launch(out.device),
    )
