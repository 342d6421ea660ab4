"""MLA decode's merge in the value projection as a Gluon kernel, its weights copied to shared
memory while it waits for stage 1.

mla_merge_projection's Triton kernel loads each program's 64 rows of the head's up-projection
(64 KB) into registers and stores them to shared memory before its wait on stage 1: Triton 3.6
puts a product's operand in shared memory right after the load that feeds it. The programs
placed last start as stage 1's slowest programs leave, so they read their weights after the wait
has long been over, and a variant that never read them was 0.4-1.0 us a layer shorter on the H100
(benchmarks/results/h100-2026-11-27-mla-weights-bound). Loading them after the wait instead was
slower still (h200-2026-11-27-mla-weights-after). Here the weights go from global to shared
memory by asynchronous copies issued at the program's start and waited on only before the
product, so their read overlaps the wait and the merge.

The merge is the Triton kernel's merge over slots, transposed as stage 1's products are: each
step's partials [SLOTS, rank] and the slots' weights in their requests' rows [SLOTS, rows] (two
bf16 parts) go to shared memory, and one warpgroup MMA adds partials^T . weights to the running
[rank, rows] sum. Then the product: the weights [64, rank] times the merged rows^T [rank, rows].
One code path whatever the chunk count; the sums' order differs from the Triton kernel's, so the
bits do too (within rounding).
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

    @gluon.jit
    def _merge_step(acc_t, total, m_i, out_head, lse_head, first, ends, s0, hi, stride_ms, part_s, high_s, low_s,
                    RANK: gl.constexpr, SLOTS: gl.constexpr, copy_layout: gl.constexpr,
                    slot_layout: gl.constexpr, mma: gl.constexpr):
        """The running merge (acc^T [rank, rows], total, max) with slots s0..s0 + SLOTS - 1 below hi."""
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
        acc_t = acc_t * gl.convert_layout(alpha, gl.SliceLayout(0, mma))[None, :]
        acc_t = warpgroup_mma(part_s.permute((1, 0)), high_s, acc_t, is_async=True)
        acc_t = warpgroup_mma(part_s.permute((1, 0)), low_s, acc_t, is_async=True)
        acc_t = warpgroup_mma_wait(num_outstanding=0, deps=(acc_t,))
        return acc_t, total, m_new

    @gluon.jit
    def _merge_project_kernel(
        MidOut, MidLse, Requests, W, Out, batch, requests_a_program,
        stride_mh, stride_ms, stride_lh, stride_wh, stride_wv, stride_ot,
        RANK: gl.constexpr, V: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_V: gl.constexpr, SLOTS: gl.constexpr,
        PDL: gl.constexpr,
    ):
        head = gl.program_id(0)
        dtype: gl.constexpr = W.dtype.element_ty
        copy_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
        slot_layout: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [1, 8], [0, 1])  # [SLOTS, rows]
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
        if PDL:
            _wait_for_previous_kernel()
        part_s = gl.allocate_shared_memory(dtype, [SLOTS, RANK], swizzled)
        step_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([SLOTS, BLOCK_M], dtype)
        high_s = gl.allocate_shared_memory(dtype, [SLOTS, BLOCK_M], step_layout)
        low_s = gl.allocate_shared_memory(dtype, [SLOTS, BLOCK_M], step_layout)
        acc_t = gl.zeros([RANK, BLOCK_M], gl.float32, mma)
        total = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(0, slot_layout))
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, gl.SliceLayout(0, slot_layout))
        out_head = MidOut + head * stride_mh
        lse_head = MidLse + head * stride_lh
        for s0 in range(lo, hi, SLOTS):
            acc_t, total, m_i = _merge_step(acc_t, total, m_i, out_head, lse_head, first, ends, s0, hi, stride_ms,
                                            part_s, high_s, low_s, RANK, SLOTS, copy_layout, slot_layout, mma)
        # Rounded to the weights' dtype where the separate merge rounded its output.
        total_t = gl.convert_layout(total, gl.SliceLayout(0, mma))
        merged_t = (acc_t / gl.where(total_t > 0, total_t, 1.0)[None, :]).to(dtype)  # [rank, rows]
        m_s = gl.allocate_shared_memory(dtype, [RANK, BLOCK_M],
                                        gl.NVMMASharedLayout.get_default_for([RANK, BLOCK_M], dtype), merged_t)
        async_copy.wait_group(0)
        fence_async_shared()
        cta_barrier()
        o_t = warpgroup_mma(w_s, m_s, gl.zeros([BLOCK_V, BLOCK_M], gl.float32, product), use_acc=False,
                            is_async=True)
        o_t = warpgroup_mma_wait(num_outstanding=0, deps=(o_t,))
        cols = gl.program_id(1) * BLOCK_V + gl.arange(0, BLOCK_V, layout=gl.SliceLayout(1, product))
        lanes_o = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, product))
        rows_o = gl.program_id(2) * requests_a_program + lanes_o
        gl.store(Out + rows_o[None, :] * stride_ot + head * V + cols[:, None], o_t.to(Out.dtype.element_ty),
                 mask=((rows_o < batch) & (lanes_o < requests_a_program))[None, :])


def merge_project(mid_out: torch.Tensor, mid_lse: torch.Tensor, requests: torch.Tensor, w_uv: torch.Tensor,
                  out: torch.Tensor, block_m: int, block_v: int, per_program: int) -> None:
    """mla_merge_projection.merge_project's contract, on this kernel: `per_program` requests a
    program in rows of `block_m`, `block_v` value columns a program (its grid, the Triton kernel's)."""
    heads, v, rank = w_uv.shape
    bs = requests.shape[0]
    grid = (heads, cdiv(v, block_v), cdiv(bs, per_program))
    _merge_project_kernel[grid](
        mid_out, mid_lse, requests, w_uv, out, bs, per_program,
        mid_out.stride(1), mid_out.stride(2), mid_lse.stride(1), w_uv.stride(0), w_uv.stride(1), out.stride(0),
        RANK=rank, V=v, BLOCK_M=block_m, BLOCK_V=block_v, SLOTS=SLOTS, num_warps=WARPS,
        **dependent_launch(out.device),
    )
