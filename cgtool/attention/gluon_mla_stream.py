"""MLA decode's stage 1 on Hopper's warpgroup MMA, the batch's key tiles streamed over every SM.

gluon_mla_wgmma cuts each request into whole chunks, so the programs that work number the
requests times their chunks: where a request's share of the SMs rounds down, SMs idle (bs 48 x
1k: two chunks a request on 96 of 132 SMs; bs 96: one chunk on 96). Here the batch's key tiles,
request after request, are divided evenly among the programs (a stream-K schedule): a program's
range of tiles may end one request and begin the next, and leaves a partial output for each
request it touches (a segment). A request's segments are merged by the last of them to finish,
or written at once where the request has one.

Segment (program p, request r) is stored at slot p + r, which no other segment takes (a later
request's first program is never before an earlier request's last), so a step's partials need
fewer than PROGRAMS + bs slots. The segments' bounds depend on the lengths alone, so the bits do
not depend on the schedule. The attention itself, the partials' layout and the merge are
gluon_mla_wgmma's.
"""

from __future__ import annotations

import torch
import triton

from cgtool.attention import gluon_mla, gluon_mla_wgmma
from cgtool.runtime.dependent_launch import dependent_launch
from cgtool.runtime.triton_launch import cdiv

gluon = gluon_mla.gluon
# The compiler's message once this process's Triton refused the kernel (launch_stage1).
_REFUSED: list[str] = []

if gluon is not None:
    from cgtool.attention.gluon_mla import _wait_for_previous_kernel, cta_barrier, gl
    from cgtool.attention.gluon_mla_wgmma import (
        _attend_keys_t,
        _merge_chunks,
        _stage_buffers,
        _store_partial_t,
        _store_rows_t,
    )

    @gluon.jit
    def _add(a, b):
        return a + b

    @gluon.jit
    def _mla_decode_stage1_stream(
        Q, Kv, MidOut, MidLse, O, Tickets, req_to_token, req_pool_indices, seq_lens, scale_log2,
        stride_qb, stride_qh, stride_kt, stride_req, stride_mb, stride_mh, stride_ms, stride_lb, stride_lh,
        stride_ob, stride_oh, batch,
        NUM_HEADS: gl.constexpr, RANK: gl.constexpr, ROPE: gl.constexpr, BLOCK_H: gl.constexpr,
        BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr, MERGE_GROUP: gl.constexpr, PDL: gl.constexpr,
        PROGRAMS: gl.constexpr, BATCH_BLOCK: gl.constexpr, PARTIAL_VEC: gl.constexpr,
    ):
        p = gl.program_id(0)
        head_block = gl.program_id(1)
        # The lengths and pool rows are the step's inputs, written before the store of its rows.
        layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        offs = gl.arange(0, BATCH_BLOCK, layout=layout)
        lens = gl.load(seq_lens + offs, mask=offs < batch, other=0)
        tiles = gl.cdiv(lens, BLOCK_N)
        ends = gl.associative_scan(tiles, 0, _add)  # each request's last tile + 1, in the batch's order
        total = gl.sum(tiles, 0)
        programs = gl.minimum(total, PROGRAMS)  # so that every working program has a tile
        if p < programs:
            if PDL:
                _wait_for_previous_kernel()
            kv_bufs, pe_bufs, q_r, q_p, p_smem = _stage_buffers(Kv, RANK, ROPE, BLOCK_H, BLOCK_N, NUM_BUF)
            g = p * total // programs
            g_end = (p + 1) * total // programs
            r = gl.sum((ends <= g).to(gl.int32), 0)
            # Only a range's first and last segments can share a request with another program,
            # so a program merges at most two requests. It does so after its loop: inside it the
            # merge's registers beside the attention's spilled.
            merge_first = r - r - 1
            merge_last = r - r - 1
            while g < g_end:
                end_r = gl.sum(gl.where(offs == r, ends, 0), 0)
                start_r = end_r - gl.sum(gl.where(offs == r, tiles, 0), 0)
                seg_end = gl.minimum(end_r, g_end)
                first, last = _programs_of(start_r, end_r, programs, total)
                pool_row = gl.load(req_pool_indices + r)
                token_row = req_to_token + pool_row.to(gl.int64) * stride_req
                keys_end = gl.minimum((seg_end - start_r) * BLOCK_N, gl.sum(gl.where(offs == r, lens, 0), 0))
                acc_t, l_i, m_i = _attend_keys_t(Q, Kv, token_row, r, head_block, (g - start_r) * BLOCK_N, keys_end,
                                                 scale_log2, stride_qb, stride_qh, stride_kt,
                                                 kv_bufs, pe_bufs, q_r, q_p, p_smem,
                                                 NUM_HEADS, RANK, ROPE, BLOCK_H, BLOCK_N, NUM_BUF, False)
                if first == last:
                    _store_rows_t(O + r * stride_ob, acc_t, l_i, head_block, stride_oh, NUM_HEADS, RANK, BLOCK_H,
                                  PARTIAL_VEC)
                else:
                    _store_partial_t(MidOut, MidLse, acc_t, l_i, m_i, 0, head_block, p + r,
                                     stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, NUM_HEADS, RANK,
                                     BLOCK_H, PARTIAL_VEC)
                    cta_barrier()
                    drawn = gl.atomic_add(Tickets + r * gl.num_programs(1) + head_block, 1, sem="acq_rel", scope="gpu")
                    if drawn == last - first:
                        if start_r < g:
                            merge_first = r  # the range began inside this request
                        else:
                            merge_last = r
                g = seg_end
                r = gl.sum((ends <= g).to(gl.int32), 0)  # the next request with keys
            if merge_first >= 0:
                _merge_request(MidOut, MidLse, O, Tickets, merge_first, head_block, offs, ends, tiles, programs,
                               total, stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ob, stride_oh,
                               NUM_HEADS, RANK, BLOCK_H, MERGE_GROUP, PARTIAL_VEC)
            if merge_last >= 0:
                _merge_request(MidOut, MidLse, O, Tickets, merge_last, head_block, offs, ends, tiles, programs,
                               total, stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ob, stride_oh,
                               NUM_HEADS, RANK, BLOCK_H, MERGE_GROUP, PARTIAL_VEC)

    @gluon.jit
    def _programs_of(start, end, programs, total):
        """The first and last programs whose ranges of tiles hold tiles start..end - 1."""
        return gl.cdiv((start + 1) * programs, total) - 1, gl.cdiv(end * programs, total) - 1

    @gluon.jit
    def _merge_request(MidOut, MidLse, O, Tickets, r, head_block, offs, ends, tiles, programs, total,
                       stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ob, stride_oh,
                       NUM_HEADS: gl.constexpr, RANK: gl.constexpr, BLOCK_H: gl.constexpr, GROUP: gl.constexpr,
                       VEC: gl.constexpr):
        """Request r's segments, slots first + r..last + r, merged into its output; its ticket reset."""
        end_r = gl.sum(gl.where(offs == r, ends, 0), 0)
        first, last = _programs_of(end_r - gl.sum(gl.where(offs == r, tiles, 0), 0), end_r, programs, total)
        gl.atomic_xchg(Tickets + r * gl.num_programs(1) + head_block, 0, sem="relaxed", scope="gpu")
        _merge_chunks(MidOut + (first + r) * stride_ms, MidLse + (first + r), O + r * stride_ob, 0, head_block,
                      last - first + 1, stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, 0, stride_oh,
                      NUM_HEADS, RANK, BLOCK_H, GROUP, VEC)


def refused() -> bool:
    """Whether this process's Triton refused to compile the kernel (then gluon_mla_wgmma's serves)."""
    return bool(_REFUSED)


def scratch_slots(bs: int, programs: int) -> int:
    """Partial outputs a step of `bs` requests may leave: one a (program, request) segment."""
    return programs + bs


def launch_stage1(
    q: torch.Tensor, latent_cache: torch.Tensor, mid_out: torch.Tensor, mid_lse: torch.Tensor, out: torch.Tensor,
    tickets: torch.Tensor, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
    scale_log2: float, block_h: int, programs: int,
) -> bool:
    """Stage 1 over grid (programs, head blocks) with its merge, gluon_mla_wgmma's tiles and
    partials (`mid_out` [1, heads, scratch_slots, rank], `mid_lse` [1, heads, scratch_slots]).
    False, having launched nothing, where this Triton refuses to compile the kernel; from then
    on `refused` says so, with one RuntimeWarning."""
    block_n, num_buf, num_warps = gluon_mla_wgmma.WGMMA_TILES
    bs, num_heads, width = q.shape
    rank = out.shape[-1]
    assert mid_out.shape[2] >= scratch_slots(bs, programs), "a slot for every (program, request) segment"
    return gluon_mla.launch_or_refuse(
        _mla_decode_stage1_stream, (programs, cdiv(num_heads, block_h), 1), _REFUSED, "gluon_mla_stream",
        "gluon_mla_wgmma", q, latent_cache, mid_out, mid_lse, out, tickets, req_to_token, req_pool_indices,
        seq_lens, scale_log2, batch=bs,
        NUM_HEADS=num_heads, RANK=rank, ROPE=width - rank, BLOCK_H=block_h, BLOCK_N=block_n, NUM_BUF=num_buf,
        MERGE_GROUP=gluon_mla_wgmma.MERGE_GROUP, PROGRAMS=programs,
        BATCH_BLOCK=max(32 * num_warps, triton.next_power_of_2(bs)), PARTIAL_VEC=gluon_mla_wgmma.PARTIAL_VEC,
        num_warps=num_warps, **dependent_launch(q.device),
    )
