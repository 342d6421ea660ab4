"""MLA decode's merge of a request's chunks, done inside its value projection.

gluon_mla_wgmma's stage 1 splits a request's keys into chunks, one program each; the last
program to finish merged the chunks' partial outputs, after a ticket (an atomic round trip
that waits for the partials' stores) and two more round trips to L2 for the log-sum-exps and
the partials. On the H200 at bs 17-64 x 1k those took 3.6-4.6 us of a 15-27 us launch
(`probe_mla_timeline.py`, benchmarks/results/h200-h100-2026-11-27-mla-flat, call 5), one
program a request doing them while the other SMs idled. The model's next step is the value
projection, a batched product of each head's latent output [tokens, rank] with its up-projection
[rank, v]; this kernel merges the partials as it loads that product's left operand, spread over
all its programs, and writes the token-major rows o_proj reads, so the merge, the ticket and the
product's transpose copy leave the step (merge is linear, so each head's rows are merged before
the product as the separate merge did).

The step's flat plan (mla_flat_plan) holds each request's first partial slot and chunk count,
read before the wait on stage 1; the partials are stage 1's flat slots [heads, slots, rank] and
base-2 log-sum-exps [heads, slots]. A program merges its requests' chunks four at a time; where
some request holds more, it walks its requests' slots instead (consecutive in the plan), SLOTS at
a time whoever owns them, and sums each slot into its request's row with a product (BY_SLOTS).
With the requests spread over more programs (SPREAD), a few requests of many chunks or one long
request among short ones took 0.4-9.5 us a layer less on both GPUs (see BY_SLOTS); why the steps of four
were slow there is not measured (loading the next four a step ahead did not help).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from cgtool.attention import gluon_mla, gluon_mla_projection, gluon_mla_wgmma, triton_mla
from cgtool.attention.mla_flat_plan import flat_plan
from cgtool.attention.triton_decode import decode_scratch
from cgtool.attention.triton_softmax import LOG2_E
from cgtool.runtime.dependent_launch import dependent_launch, wait_for_previous_kernel
from cgtool.runtime.kernel_trace import sm_id, stamp_after, trace_store
from cgtool.runtime.triton_launch import CachedKernel, cdiv

# Rows (requests) and value columns a program, chunks merged a step, warps. 16 rows is the least
# tl.dot takes. 64 columns (two programs a head and 16-row block) against 32, H200, three
# alternating rounds (call 2 of benchmarks/results/h200-h100-2026-11-27-mla-projection): 0.6-1.6 us a
# layer shorter at bs 17-64 x 1k and with one 16k request among 40 of 300; 32 rows 0.2-1.3
# shorter there but 5 us longer in the skewed batch; 8 chunks a step 0.1-1.3 longer, 4 warps
# within 0.4 us; one chunk a step 0.3-4.7 longer, at 4 warps -0.2 to +3.4 (call 1 of
# benchmarks/results/h200-h100-2026-11-27-stage1-settings).
BLOCK_M, BLOCK_V, MERGE_GROUP, WARPS = 16, 64, 4, 8
# Whether decode merges in the projection where it can (`serves`); off, gluon_mla_wgmma's last
# program merges and the projection is torch's product (benchmarks time both).
MERGE_IN_PROJECTION = True
# It serves up to this many requests: a request of 1k keys or more then has 2 chunks or more.
# Past it most requests are one chunk, which gluon_mla_wgmma writes at once with no merge to
# save, and this kernel was slower than torch's product: bs 96 / 128 x 1k 40.3 / 50.8 us a
# layer against 38.9 / 46.1 apart (H200, call 1 of
# benchmarks/results/h200-h100-2026-11-27-mla-projection, the kernel's first form).
MAX_BS = triton_mla.WGMMA_PROGRAMS // 2
# And from this many: gluon_mla_wgmma's flat stage 1 with this kernel's merge, where
# mla_decode_attention would run gluon_mla's stage 1 and its merge (below WGMMA_MIN_BS). From
# 5 requests first (2026-11-27: a layer 0.2-3.7 us shorter at bs 5-16 x 512-8k, but at bs 1-4
# even to 9 us longer, one request's 128 chunks merged here). Since the merge over slots, the
# capped plan and the Gluon projection, whole decode steps of deepseek-v2-lite at bs 1-4 x 1k,
# 4k and 8k were 1.2-4.1% shorter this way on the H200 and 1.5-3.3% on the H100 (1.8-7.4 us a
# layer; calls 4-5 of benchmarks/results/h200-h100-2026-11-28-mla-small-batches), so every
# decode batch up to MAX_BS takes it.
MIN_BS = 1
# Requests a program (up to BLOCK_M, tl.dot's least rows; the rest masked off) chosen so that
# a head's column block takes about ROW_BLOCKS programs whatever the batch's size (SPREAD);
# else BLOCK_M, so that 16 requests or fewer took one program a head's column block, merging all
# their chunks. With the merge over slots below it is what makes that merge pay: 4 row blocks
# against 1, 8 x 4k 19.3 against 22.9 us a layer, 16 x 4k 29.5 against 33.2 (H200, call 4 of
# benchmarks/results/h200-h100-2026-11-27-mla-merge-slots). With GROUP chunks a step alone it
# was within -0.7 to +0.3 us (call 2). 2 row blocks: 0.8 us longer at 8 x 4k on the H100 (call
# 9); 8: 3.6-5.6 us longer everywhere, past one wave of programs (call 2).
SPREAD = True
ROW_BLOCKS = 4
# A program whose requests hold more than GROUP chunks merges over its partial slots
# (BY_SLOTS) rather than GROUP chunks of every request a step, a round trip to L2 each however
# few of its requests have that many: its requests' chunks hold consecutive slots in the step's
# plan, so it loads SLOTS of them a step whatever each request's count, and weighs them into
# its requests' rows by a product with each slot's weight in its request's row (BLOCK_M x SLOTS,
# nought elsewhere), the weights as two bf16 parts. SLOT_STAGES steps in flight (Triton's
# software pipelining; 1 or 2 stages were 0.2-2.6 us a layer longer at every shape, call 5).
# With SPREAD and stage 1's early slots, against the build before in one process (H100, call
# 7): 8 x 4k 23.0 against 25.0 us a layer, 16 x 2k 23.1 / 23.7, 16 x 4k 36.1 / 37.2, 40 x 300 +
# 1 x 16,000 keys 25.1 / 34.4, bs 8 x 1k 13.7 / 13.2, elsewhere -1.1 (32 x 8k) to +0.1; H200,
# calls 4-5: 8 x 4k 19.4 against 21.0, the skewed batch 22.2 against 31.7. Every program over
# slots, a step of GROUP chunks never: 0.1-4.1 us longer at bs 16-64 x 1k (call 3). Steps of
# GROUP chunks up to 8 (two steps): within 0.2 us, 16 x 2k-4k 0.2-0.4 longer (H100, calls 8-9). 16 or 64 slots a step: longer
# (call 3). The next group's loads issued before this one's weights (a register each): no
# shorter at 8 x 4k, 0.0-0.6 longer elsewhere (H200, call 1).
BY_SLOTS = True
SLOTS = 32
SLOT_STAGES = 3
# The product taken transposed (True): the weights' rows [BLOCK_V, RANK] times the merged rows'
# transpose, which Hopper runs as a warpgroup MMA (64 columns as its rows), then transposed
# back; else merged [BLOCK_M, RANK] times the weights' transpose, one MMA chain of RANK / 16 steps
# a warp. Transposed was 0.05-0.26 us a layer shorter at every shape timed (H200, calls 6-7 of
# benchmarks/results/h200-h100-2026-11-27-mla-range-mask; H100 call 8: 0.06-0.27).
PRODUCT_T = True
# gluon_mla_projection's kernel where Gluon runs (else this module's Triton kernel): its weights
# copied to shared memory asynchronously while the program waits for stage 1. A layer (the store,
# stage 1 and the projection, 27 layers a graph, five alternating rounds) was 0.4-1.1 us shorter
# at bs 8-64 x 1k-8k on the H200 and 0.2-0.8 on the H100 (16 x 4k and 5 x 1k even), and 0.5-0.8
# longer with one 16k request among 40 of 300 (calls 11-12 of
# benchmarks/results/h200-h100-2026-11-27-mla-gluon-projection).
GLUON_KERNEL = True
# In it, a program whose requests' chunks fit one step of slots takes each slot's product with
# the weights first, then weighs the slots into rows (gluon_mla_projection._project_one_step).
# Against the merge first, H100, two calls, five alternating rounds each: a layer 0.27-0.39 us
# shorter at bs 16-17 x 1k, 0.31-0.41 at 8 x 4k and 16 x 2k; even at 24 x 1k (rows of four
# chunks or fewer, which merge elementwise) and with one 16k request among 40 of 300 (calls 13 and 16 of
# benchmarks/results/h100-h200-2026-11-27-mla-step-and-trials). H200: 0.3-0.4 us shorter at bs
# 16-17 x 1k; whole decode steps 0.18-0.60 us a layer shorter at bs 16-32 x 1k, on the H100
# mixed within 0.5 (calls 1-3 of benchmarks/results/h100-2026-11-28-mla-key-step).
PROJECT_FIRST = True
# And where they fit two steps (2 * SLOTS slots, the two buffers of partials taken as one), the
# same in one step rather than the merge over slots. A batch of equal lengths holds up to 132
# chunks, about 33 a program over ROW_BLOCKS programs, so some sizes fell a few slots past a step:
# bs 21-22 x 1k (6 requests of 6 chunks), 9-12 x 2k (3 of 11), 17-26 x 2k-8k and 5-14 x 4k-8k
# (33-52 slots; tests/test_mla_merge_projection.py). Those programs took the merge over slots, two
# round trips to L2 and the product after the merge. Projected first, both steps' loads issued
# together: a layer 0.11-0.37 us shorter at all 17 such shapes timed, within -0.05 to +0.12 at
# shapes that do not take it; whole decode steps 0.3-1.5 us a layer shorter at bs 21-22 x 1k and
# 12 x 2k, within 0.16 either way at 21-22 x 2k (H100, calls 6 and 10 of
# benchmarks/results/h100-h200-2026-11-28-mla-wide-step). The two steps staged one after the
# other were no shorter (call 4). Not timed on an H200. Since CAP_CHUNKS (below) a batch of equal
# lengths makes no such program; a mixed one may (6 x 2k with 6 x 512: 48 slots).
WIDE_STEP = True
# The step's plan shares the chunks among fewer programs than stage 1 may run where an equal
# share would give a projection program more slots than one step (`plan_programs`): fewer,
# longer chunks, and each program of this kernel within one step or four chunks a row. With
# 96-120 programs for the plan (H100, call 12 of
# benchmarks/results/h100-h200-2026-11-28-mla-wide-step): bs 21 x 1k 67% of the latent read
# against 59%, 9 x 2k 63% against 54%, 10 x 2k 63% against 57%, 5 x 4k 64% against 58%; where
# an equal share already fits (bs 12-16 x 1k) fewer programs were slower.
CAP_CHUNKS = True


@triton.jit
def _partial(MidOutHead, first, chunk, chunks, stride_ms, offs_r):
    """Each row's partial of its chunk `chunk` [BLOCK_M, RANK] (zeros past its chunks)."""
    return tl.load(MidOutHead + (first + chunk)[:, None] * stride_ms + offs_r[None, :],
                   mask=(chunk < chunks)[:, None], other=0.0, cache_modifier=".cg")


@triton.jit
def _log_sum_exp(MidLseHead, first, chunk, chunks):
    """Each row's base-2 log-sum-exp of its chunk `chunk` [BLOCK_M] (-inf past its chunks)."""
    return tl.load(MidLseHead + first + chunk, mask=chunk < chunks, other=float("-inf"), cache_modifier=".cg")


@triton.jit
def _group(MidOutHead, MidLseHead, first, c0, chunks, stride_ms, offs_r):
    """Four chunks' partials and log-sum-exps from chunk c0, loaded together."""
    return (_partial(MidOutHead, first, c0, chunks, stride_ms, offs_r),
            _partial(MidOutHead, first, c0 + 1, chunks, stride_ms, offs_r),
            _partial(MidOutHead, first, c0 + 2, chunks, stride_ms, offs_r),
            _partial(MidOutHead, first, c0 + 3, chunks, stride_ms, offs_r),
            _log_sum_exp(MidLseHead, first, c0, chunks), _log_sum_exp(MidLseHead, first, c0 + 1, chunks),
            _log_sum_exp(MidLseHead, first, c0 + 2, chunks), _log_sum_exp(MidLseHead, first, c0 + 3, chunks))


@triton.jit
def _weigh(acc, total, lse_max, part0, part1, part2, part3, lse0, lse1, lse2, lse3):
    """The running merge (acc, total, lse_max) with four more chunks: weights elementwise
    across them, a chunk past the request's count at log-sum-exp -inf weighing 0."""
    new_max = tl.maximum(lse_max, tl.maximum(tl.maximum(lse0, lse1), tl.maximum(lse2, lse3)))
    safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
    rescale = tl.exp2(lse_max - safe_max)
    w0, w1 = tl.exp2(lse0 - safe_max), tl.exp2(lse1 - safe_max)
    w2, w3 = tl.exp2(lse2 - safe_max), tl.exp2(lse3 - safe_max)
    acc = acc * rescale[:, None]
    acc += part0.to(tl.float32) * w0[:, None]
    acc += part1.to(tl.float32) * w1[:, None]
    acc += part2.to(tl.float32) * w2[:, None]
    acc += part3.to(tl.float32) * w3[:, None]
    return acc, total * rescale + w0 + w1 + w2 + w3, new_max


@triton.jit
def _slot_step(acc, total, lse_max, MidOutHead, MidLseHead, first, ends, hi, s0, stride_ms, offs_r,
               SLOTS: tl.constexpr):
    """The running merge with the SLOTS slots from s0 on, each weighed into its request's row."""
    slots = s0 + tl.arange(0, SLOTS)
    mine = (slots[None, :] >= first[:, None]) & (slots[None, :] < ends[:, None])  # [BLOCK_M, SLOTS]
    # Every slot up to hi is read. One that no request names (a request of no keys, between
    # two that have some) weighs nought, but its memory may hold anything, and a value that
    # is not finite times nought is not nought: such values read as 0. Masking the loads to
    # the named slots instead (a reduction over the rows and two layout changes a step) was
    # 0.27-0.47 us a layer longer wherever this merge serves (calls 2-4 of
    # benchmarks/results/h200-h100-2026-11-27-mla-range-mask).
    in_range = slots < hi
    part = tl.load(MidOutHead + slots[:, None] * stride_ms + offs_r[None, :], mask=in_range[:, None],
                   other=0.0, cache_modifier=".cg")  # [SLOTS, RANK]
    part = tl.where(tl.abs(part) < float("inf"), part, 0.0)
    lse = tl.load(MidLseHead + slots, mask=in_range, other=float("-inf"), cache_modifier=".cg")
    scores = tl.where(mine, lse[None, :], float("-inf"))
    new_max = tl.maximum(lse_max, tl.max(scores, 1))
    safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
    rescale = tl.exp2(lse_max - safe_max)
    weights = tl.exp2(scores - safe_max[:, None])
    total = total * rescale + tl.sum(weights, 1)
    # The weights as two bf16 parts, so that the products keep about 16 bits of each.
    high = weights.to(part.dtype)
    low = (weights - high.to(tl.float32)).to(part.dtype)
    acc = tl.dot(low, part, tl.dot(high, part, acc * rescale[:, None]))
    return acc, total, new_max


@triton.jit
def _weigh_slots(acc, total, lse_max, MidOutHead, MidLseHead, first, ends, stride_ms, offs_r,
                 SLOTS: tl.constexpr):
    """The running merge over every chunk of the program's requests, SLOTS partial slots a step:
    their slots run from the first request's first to the last one's last. (The first step
    straight-line, the rest a loop: -0.12 to +0.13 us a layer, H200 call 7 of the folder named
    in `_slot_step`.)"""
    lo = tl.min(tl.where(ends > first, first, 2147483647), 0)
    hi = tl.max(tl.where(ends > first, ends, 0), 0)
    for s0 in range(lo, hi, SLOTS):
        acc, total, lse_max = _slot_step(acc, total, lse_max, MidOutHead, MidLseHead, first, ends, hi, s0,
                                         stride_ms, offs_r, SLOTS)
    return acc, total, lse_max


@triton.jit
def _merge_project_kernel(
    MidOut, MidLse, Requests, W, Out, batch, requests_a_program,
    stride_mh, stride_ms, stride_lh, stride_wh, stride_wv, stride_ot, Trace,
    RANK: tl.constexpr, V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, GROUP: tl.constexpr,
    PDL: tl.constexpr, BY_SLOTS: tl.constexpr = False, SLOTS: tl.constexpr = 32, TRACE: tl.constexpr = False,
    PRODUCT_T: tl.constexpr = False,
):
    head = tl.program_id(0)
    # TRACE (benchmarks/probe_mla_projection_timeline.py): the SM, then stamps at the start, once
    # the plan's rows are loaded, after the wait on stage 1, once merged, once multiplied.
    program = (head * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(2) + tl.program_id(2)
    if TRACE:
        trace_store(Trace, program, 0, sm_id())
        trace_store(Trace, program, 1, stamp_after(program))
    offs_v = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    lanes = tl.arange(0, BLOCK_M)
    rows = tl.program_id(2) * requests_a_program + lanes
    offs_r = tl.arange(0, RANK)
    # Neither the weights nor the step's plan (written before stage 1 ran) depend on stage 1:
    # loaded while it finishes.
    if PRODUCT_T:
        w = tl.load(W + head * stride_wh + offs_v[:, None] * stride_wv + offs_r[None, :])  # [BLOCK_V, RANK]
    else:
        w = tl.load(W + head * stride_wh + offs_v[None, :] * stride_wv + offs_r[:, None])  # [RANK, BLOCK_V]
    in_batch = (rows < batch) & (lanes < requests_a_program)
    first = tl.load(Requests + 2 * rows, mask=in_batch, other=0)
    chunks = tl.load(Requests + 2 * rows + 1, mask=in_batch, other=0)
    if TRACE:
        trace_store(Trace, program, 2, stamp_after(tl.sum(first + chunks, 0)))
    wait_for_previous_kernel(PDL)
    if TRACE:
        trace_store(Trace, program, 3, stamp_after(program))
    lse_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    acc = tl.zeros([BLOCK_M, RANK], tl.float32)
    total = tl.zeros([BLOCK_M], tl.float32)
    # GROUP chunks a step, their log-sum-exps and partials loaded together: one round trip to
    # L2 a group, where loading the partials after the weights made from the log-sum-exps took
    # two. Four partials and four log-sum-exp vectors of their own, so that the weights are
    # elementwise across them: a [rows, GROUP] tile's reductions went through shared memory
    # and a barrier each, and a [rows, GROUP, RANK] load spilled under Triton 3.9.
    tl.static_assert(GROUP == 4, "four partials a step, loaded one by one")
    out_head = MidOut + head * stride_mh
    lse_head = MidLse + head * stride_lh
    most = tl.max(chunks, 0)
    if BY_SLOTS:
        # One step of GROUP chunks, straight-line: as a loop of one trip it was 0.2-0.3 us a
        # layer longer at bs 24-48 x 1k (H100, call 7 against calls 8-9 of the folder named at
        # BY_SLOTS, another machine, where the build before's times agreed to 0.1 us).
        if most <= GROUP:
            p0, p1, p2, p3, l0, l1, l2, l3 = _group(out_head, lse_head, first, 0, chunks, stride_ms, offs_r)
            acc, total, lse_max = _weigh(acc, total, lse_max, p0, p1, p2, p3, l0, l1, l2, l3)
        else:
            acc, total, lse_max = _weigh_slots(acc, total, lse_max, out_head, lse_head, first, first + chunks,
                                               stride_ms, offs_r, SLOTS)
    else:
        for c0 in range(0, most, GROUP):
            p0, p1, p2, p3, l0, l1, l2, l3 = _group(out_head, lse_head, first, c0, chunks, stride_ms, offs_r)
            acc, total, lse_max = _weigh(acc, total, lse_max, p0, p1, p2, p3, l0, l1, l2, l3)
    # Rounded to the weights' dtype where the separate merge rounded its output.
    merged = (acc / tl.where(total > 0, total, 1.0)[:, None]).to(W.dtype.element_ty)
    if TRACE:
        trace_store(Trace, program, 4, stamp_after(tl.sum(total, 0)))
    if PRODUCT_T:
        o = tl.trans(tl.dot(w, tl.trans(merged)))
    else:
        o = tl.dot(merged, w)
    if TRACE:
        trace_store(Trace, program, 5, stamp_after(tl.sum(tl.sum(o, 1), 0)))
    tl.store(Out + rows[:, None] * stride_ot + head * V + offs_v[None, :], o.to(Out.dtype.element_ty),
             mask=in_batch[:, None])


_MERGE_PROJECT = CachedKernel(_merge_project_kernel)


def merge_project(mid_out: torch.Tensor, mid_lse: torch.Tensor, requests: torch.Tensor, w_uv: torch.Tensor,
                  out: torch.Tensor, trace: torch.Tensor | None = None) -> None:
    """out [bs, heads * v] = each head's merged latent output [bs, rank] times w_uv[head]
    ([heads, v, rank], rows at any stride): the partials `mid_out` [1, heads, slots, rank] and
    `mid_lse` [1, heads, slots] of the requests' chunks, `requests` [bs, 2] int32 (first slot,
    chunks; a request of no chunks gets zeros: the step's `FlatPlan.requests`, written before
    stage 1 ran). Launched as a programmatic dependent of stage 1 where dependent launches run.
    `trace` (int64, TRACE_SLOTS a program of `projection_programs`) takes the programs' stamps."""
    heads, v, rank = w_uv.shape
    bs = requests.shape[0]
    assert mid_out.shape[1] == heads and mid_out.shape[-1] == rank and mid_out.stride(-1) == 1
    assert w_uv.stride(-1) == 1 and out.shape == (bs, heads * v) and out.stride(-1) == 1
    assert v % BLOCK_V == 0, f"the value head ({v}) is whole blocks of {BLOCK_V} columns (`serves` says)"
    assert requests.is_contiguous()
    per_program = requests_a_program(bs)
    if GLUON_KERNEL and gluon_mla.available(out.device):
        gluon_mla_projection.merge_project(mid_out, mid_lse, requests, w_uv, out, BLOCK_M, BLOCK_V, per_program,
                                           trace, PROJECT_FIRST, WIDE_STEP)
        return
    grid = (heads, cdiv(v, BLOCK_V), cdiv(bs, per_program))
    assert trace is None or trace.shape[0] >= grid[0] * grid[1] * grid[2], "a trace row for every program"
    _MERGE_PROJECT.launch(
        grid, mid_out, mid_lse, requests, w_uv, out, bs, per_program,
        mid_out.stride(1), mid_out.stride(2), mid_lse.stride(1), w_uv.stride(0), w_uv.stride(1), out.stride(0),
        requests if trace is None else trace,
        RANK=rank, V=v, BLOCK_M=BLOCK_M, BLOCK_V=BLOCK_V, GROUP=MERGE_GROUP, BY_SLOTS=BY_SLOTS,
        SLOTS=SLOTS, TRACE=trace is not None, PRODUCT_T=PRODUCT_T, **dependent_launch(out.device),
        num_warps=WARPS, num_stages=SLOT_STAGES if BY_SLOTS else 1,
    )


def projection_programs(batch_size: int, heads: int, v: int) -> int:
    """Programs `merge_project` launches for `batch_size` requests of `heads` value heads of width `v`."""
    return heads * cdiv(v, BLOCK_V) * cdiv(batch_size, requests_a_program(batch_size))


def plan_programs(batch_size: int) -> int:
    """Programs the step's flat plan shares the batch's key tiles among (stage 1 runs these and
    one a request, mla_flat_plan): stage 1's WGMMA_PROGRAMS, or fewer where an equal share of
    them would give this kernel's programs more chunks than one step of SLOTS slots or a
    merge of MERGE_GROUP chunks takes (CAP_CHUNKS). At equal lengths a request's share is at
    most programs // batch_size chunks."""
    if not CAP_CHUNKS:
        return triton_mla.WGMMA_PROGRAMS
    chunks = max(MERGE_GROUP, SLOTS // requests_a_program(batch_size))
    return min(triton_mla.WGMMA_PROGRAMS, batch_size * (chunks + 1) - 1)


def requests_a_program(batch_size: int) -> int:
    """Requests each program of `merge_project` merges and multiplies (SPREAD)."""
    return min(BLOCK_M, cdiv(batch_size, ROW_BLOCKS)) if SPREAD else BLOCK_M


def merge_project_ref(mid_out: torch.Tensor, mid_lse: torch.Tensor, requests: torch.Tensor,
                      w_uv: torch.Tensor) -> torch.Tensor:
    """`merge_project` in torch, fp32 throughout, rounded to w_uv's dtype at the end."""
    heads, v, rank = w_uv.shape
    rows = []
    for first, chunks in requests.tolist():
        if chunks == 0:
            rows.append(torch.zeros(heads, rank, device=w_uv.device))
            continue
        lse = mid_lse[0, :, first:first + chunks].float()  # [heads, chunks]
        weight = torch.softmax(lse * torch.log(torch.tensor(2.0)), dim=-1)
        rows.append((mid_out[0, :, first:first + chunks].float() * weight[..., None]).sum(1))
    merged = torch.stack(rows, 1)  # [heads, bs, rank]
    o = torch.bmm(merged, w_uv.float().transpose(1, 2))  # [heads, bs, v]
    return o.transpose(0, 1).reshape(len(rows), heads * v).to(w_uv.dtype)


def serves(q: torch.Tensor, w_uv: torch.Tensor) -> bool:
    """Whether `decode_projected` runs for this decode batch: from MIN_BS to MAX_BS requests of
    one head block, gluon_mla_wgmma's stage 1 mapping its chunks flat (Gluon on Hopper)."""
    bs, num_heads, _ = q.shape
    return (MERGE_IN_PROJECTION and q.is_cuda and MIN_BS <= bs <= MAX_BS
            and gluon_mla_wgmma.flat_serves(num_heads) and not gluon_mla_wgmma.refused()
            and gluon_mla.available(q.device) and gluon_mla.supports(w_uv.shape[-1], q.shape[-1] - w_uv.shape[-1])
            and w_uv.shape[1] % BLOCK_V == 0)


def decode_projected(
    q: torch.Tensor, latent_cache: torch.Tensor, w_uv: torch.Tensor, out: torch.Tensor, req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, sm_scale: float,
    scratch: dict[object, Any] | None = None, trace: torch.Tensor | None = None,
    memo: dict[object, Any] | None = None, projection_trace: torch.Tensor | None = None,
) -> bool:
    """MLA decode attention and the heads' value projection: q [bs, heads, rank + rope] over
    the latent pool, out [bs, heads * v] = each head's attention output times w_uv[head]
    ([heads, v, rank]). gluon_mla_wgmma's stage 1 leaves its chunks unmerged, and
    `merge_project` merges them as it multiplies, both mapped by the step's flat plan (from
    `memo`, `batch.forward_memo()`, once a layer of this forward has planned it). False,
    having launched nothing but perhaps the plan, where it does not serve (`serves`) or this
    Triton refuses the stage 1: the caller runs the attention and its product apart. `trace` and
    `projection_trace` take the two kernels' program stamps (benchmarks)."""
    if not serves(q, w_uv):
        return False
    bs, num_heads, _ = q.shape
    rank = w_uv.shape[-1]
    programs = plan_programs(bs)
    slots = gluon_mla_wgmma.flat_slots(bs, programs)
    mid_out, mid_lse = decode_scratch(1, num_heads, rank, slots, q.device, scratch,
                                      triton_mla.PARTIAL_DTYPE_EIGHT_WARPS_FUSED, any_splits=True)
    plan = flat_plan(seq_lens, req_pool_indices, programs, triton_mla.WGMMA_MIN_CHUNK,
                     gluon_mla_wgmma.WGMMA_TILES[0], memo)
    # Unmerged, stage 1 writes no output row: its `out` only names the rank.
    if not gluon_mla_wgmma.launch_stage1(
            q, latent_cache, mid_out, mid_lse, mid_out[0], None, req_to_token, req_pool_indices, seq_lens,
            sm_scale * LOG2_E, triton_mla.BLOCK_H, triton_mla.mla_num_kv_splits(bs, num_heads),
            triton_mla.WGMMA_MIN_CHUNK, programs, trace, flat=True, plan=plan):
        return False
    merge_project(mid_out, mid_lse, plan.requests, w_uv, out, projection_trace)
    return True
