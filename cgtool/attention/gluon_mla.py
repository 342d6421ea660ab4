"""MLA decode's stage 1 with its latent rows' buffers placed by hand (Triton's Gluon dialect).

Triton 3.6 compiles triton_mla's stage 1 with one shared-memory tile of latent rows: each
step waits for its block's copies, then computes, then asks for the next block, so a program
alone on an SM pays a whole load's latency every 64 keys (4.4-5 us a block on an H100 and an
H200, docs/moe-mla.md section 5). Here the program keeps NUM_BUF tiles: the copies of the
blocks NUM_BUF - 1 ahead are in flight while this block's products run, and the pool slots of
the block after those are loaded a step earlier still, so neither the gather's addresses nor
its rows wait in line.

Chunks and partial outputs are laid out exactly as triton_mla's stage 1 lays them out
(`_chunk_len`: the same keys a chunk, the same empty chunks), so triton_mla's merge kernel
merges them, or, as there, the last program of a request's chunks does (runtime.tickets). Gluon runs only on an NVIDIA GPU from Hopper on (no interpreter): `available()`
says whether this process can use it; elsewhere triton_mla's kernel serves.
"""

from __future__ import annotations

import functools
import os
import warnings

import torch
from triton.compiler.errors import CompilationError

try:  # Gluon is experimental: absent or renamed in some Triton releases
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
except ImportError:  # pragma: no cover - depends on the installed Triton
    gluon = None
else:
    # Triton 3.6's names; later releases call them `barrier` and `async_load`.
    cta_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier
    copy_to_shared = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared

from cgtool.runtime.dependent_launch import dependent_launch
from cgtool.runtime.triton_launch import cdiv

# The compiler's message once this process's Triton refused the kernel (launch_stage1).
_REFUSED: list[str] = []

# Four running sums of q . k instead of one: where the last program merges, 0.8-2.6% shorter
# launches on the H200 and 0.3-1% on the H100 (bs 32-128 x 1k, bs 32 x 8k); on the merge
# kernel's path 2-16% longer (bs 16 x 1k, bs 8 x 8k), so one there. Timed in alternation in one
# process (benchmarks/results/h200-h100-2026-11-27-gluon-mla, calls 8-10).
SCORE_CHAINS = 4
# On the merge kernel's path, that kernel (a programmatic dependent) released at this stage 1's
# start (True), so that its programs are placed while stage 1 runs and wait for its end there;
# else (as shipped) it is launched at stage 1's end. At the start it was 0.5-0.6 us a layer
# shorter at bs 1 x 8k and bs 16 x 1k but 0.4-0.7 longer at bs 8 x 1k and 8 x 4k (H200, five
# alternating rounds, benchmarks/results/h200-h100-2026-11-27-mla-flat-plan, call 7).
RELEASE_MERGE_AT_START = False


def available(device: torch.device) -> bool:
    """Whether the buffered stage 1 runs on `device`: Gluon importable, not Triton's
    interpreter, an NVIDIA Hopper GPU (compute capability 9, the only kind it was timed on),
    and this Triton has not refused to compile it."""
    if gluon is None or _REFUSED or os.environ.get("TRITON_INTERPRET") == "1" or device.type != "cuda":
        return False
    return _is_hopper(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _is_hopper(index: int) -> bool:
    return torch.version.hip is None and torch.cuda.get_device_capability(index)[0] == 9


if gluon is not None:

    @gluon.jit
    def _chunk_keys(seq_len, NUM_SPLITS: gl.constexpr, BLOCK_N: gl.constexpr, MIN_CHUNK: gl.constexpr):
        """Keys a chunk, as triton_mla._chunk_len counts them."""
        half: gl.constexpr = max(NUM_SPLITS // 2, 1)
        per_split = gl.cdiv(gl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
        per_half = gl.cdiv(gl.cdiv(seq_len, half), BLOCK_N) * BLOCK_N
        return gl.maximum(per_split, gl.minimum(MIN_CHUNK, per_half))

    @gluon.jit
    def _merge_heads(MidOut, MidLse, O, b, head_block, seq_len, keys,
                     stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ob, stride_oh,
                     NUM_HEADS: gl.constexpr, RANK: gl.constexpr, BLOCK_H: gl.constexpr, MERGE_D: gl.constexpr,
                     NUM_SPLITS: gl.constexpr, WARPS: gl.constexpr):
        """triton_mla._merge_head_block: a request's chunks merged by weights 2^(lse - max), in
        split order, the loads through L2 (.cg) since other programs wrote them."""
        layout: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [WARPS, 1], [1, 0])
        heads = head_block * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, layout))
        mask_h = heads < NUM_HEADS
        lse_ptrs = MidLse + b * stride_lb + heads * stride_lh
        lse_max = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(1, layout))
        for s in gl.static_range(NUM_SPLITS):
            used = mask_h & (gl.full([BLOCK_H], s, gl.int32, gl.SliceLayout(1, layout)) * keys < seq_len)
            lse = gl.load(lse_ptrs + s, mask=used, other=float("-inf"), cache_modifier=".cg")
            lse_max = gl.maximum(lse_max, lse)
        lse_max = gl.where(mask_h, lse_max, 0.0)
        for d0 in gl.static_range(0, RANK, MERGE_D):
            offs_d = d0 + gl.arange(0, MERGE_D, layout=gl.SliceLayout(0, layout))
            acc = gl.zeros([BLOCK_H, MERGE_D], gl.float32, layout)
            total = gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(1, layout))
            for s in gl.static_range(NUM_SPLITS):
                used = mask_h & (gl.full([BLOCK_H], s, gl.int32, gl.SliceLayout(1, layout)) * keys < seq_len)
                lse = gl.load(lse_ptrs + s, mask=used, other=float("-inf"), cache_modifier=".cg")
                weight = gl.where(used, gl.exp2(lse - lse_max), 0.0)
                part = gl.load(MidOut + b * stride_mb + heads[:, None] * stride_mh + s * stride_ms + offs_d[None, :],
                               mask=used[:, None], other=0.0, cache_modifier=".cg")
                acc += part.to(gl.float32) * weight[:, None]
                total += weight
            merged = acc / gl.where(total > 0, total, 1.0)[:, None]
            gl.store(O + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                     merged.to(O.dtype.element_ty), mask=mask_h[:, None])

    @gluon.jit
    def _load_slots(token_row, start_n, end, BLOCK_N: gl.constexpr, layout: gl.constexpr):
        """Pool slots of keys start_n.. (0 past `end`), int64 so slot x stride cannot overflow."""
        offs_n = start_n + gl.arange(0, BLOCK_N, layout=layout)
        return gl.load(token_row + offs_n, mask=offs_n < end, other=0).to(gl.int64)

    @gluon.jit
    def _copy_rows(Kv, kv_buf, pe_buf, slots, start_n, end, stride_kt,
                   RANK: gl.constexpr, ROPE: gl.constexpr, BLOCK_N: gl.constexpr, copy_layout: gl.constexpr):
        """Asynchronous copies of rows start_n.. into one buffer; rows past `end` read nothing."""
        offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, copy_layout))
        rows = Kv + slots[:, None] * stride_kt
        mask_n = (offs_n < end)[:, None]
        offs_r = gl.arange(0, RANK, layout=gl.SliceLayout(0, copy_layout))
        offs_p = gl.arange(0, ROPE, layout=gl.SliceLayout(0, copy_layout))
        copy_to_shared(kv_buf, rows + offs_r[None, :], mask=mask_n)
        copy_to_shared(pe_buf, rows + RANK + offs_p[None, :], mask=mask_n)
        async_copy.commit_group()

    @gluon.jit
    def _release_next_kernel():
        """griddepcontrol.launch_dependents: the next kernel (a programmatic dependent) may be
        scheduled; it still waits for this one to finish before reading its results."""
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)

    @gluon.jit
    def _wait_for_previous_kernel():
        """griddepcontrol.wait: the kernel before (this one launched as its programmatic
        dependent) has finished and its writes are visible."""
        gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _load_q(Q, b, head_block, stride_qb, stride_qh, NUM_HEADS: gl.constexpr, RANK: gl.constexpr,
                ROPE: gl.constexpr, BLOCK_H: gl.constexpr, layout: gl.constexpr, smem: gl.constexpr):
        """The head block's query, its rank and rope parts in shared memory (the MMAs reread them)."""
        heads = head_block * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, layout))
        q_rows = Q + b * stride_qb + heads[:, None] * stride_qh
        mask_h = (heads < NUM_HEADS)[:, None]
        offs_r = gl.arange(0, RANK, layout=gl.SliceLayout(0, layout))
        offs_p = gl.arange(0, ROPE, layout=gl.SliceLayout(0, layout))
        q_r = gl.allocate_shared_memory(Q.dtype.element_ty, [BLOCK_H, RANK], smem,
                                        gl.load(q_rows + offs_r[None, :], mask=mask_h, other=0.0))
        q_p = gl.allocate_shared_memory(Q.dtype.element_ty, [BLOCK_H, ROPE], smem,
                                        gl.load(q_rows + RANK + offs_p[None, :], mask=mask_h, other=0.0))
        return q_r, q_p

    @gluon.jit
    def _scores(q_r, q_p, kv, pe, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, mma: gl.constexpr,
                dot_a: gl.constexpr, dot_b: gl.constexpr, CHAINS: gl.constexpr):
        """q . k over the latent's rank and rope parts. A warp holds 8 keys, one MMA tile, so
        one running sum chains every product of the 576-wide row after the last, each waiting
        out the MMA's latency; CHAINS 4 keeps four sums over interleaved 32-wide slices of the
        rank instead."""
        zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, mma)
        if CHAINS == 1:
            s = mma_v2(q_r.load(dot_a), kv.permute((1, 0)).load(dot_b), zero)
            return mma_v2(q_p.load(dot_a), pe.permute((1, 0)).load(dot_b), s)
        SLICE: gl.constexpr = 32
        RANK: gl.constexpr = q_r.shape[1]
        s0 = mma_v2(q_p.load(dot_a), pe.permute((1, 0)).load(dot_b), zero)
        s1 = zero
        s2 = zero
        s3 = zero
        for d in gl.static_range(0, RANK, 4 * SLICE):
            s0 = mma_v2(q_r.slice(d, SLICE, 1).load(dot_a), kv.slice(d, SLICE, 1).permute((1, 0)).load(dot_b), s0)
            s1 = mma_v2(q_r.slice(d + SLICE, SLICE, 1).load(dot_a),
                        kv.slice(d + SLICE, SLICE, 1).permute((1, 0)).load(dot_b), s1)
            s2 = mma_v2(q_r.slice(d + 2 * SLICE, SLICE, 1).load(dot_a),
                        kv.slice(d + 2 * SLICE, SLICE, 1).permute((1, 0)).load(dot_b), s2)
            s3 = mma_v2(q_r.slice(d + 3 * SLICE, SLICE, 1).load(dot_a),
                        kv.slice(d + 3 * SLICE, SLICE, 1).permute((1, 0)).load(dot_b), s3)
        return (s0 + s1) + (s2 + s3)

    @gluon.jit
    def _attend_tile(acc, l_i, m_i, q_r, q_p, kv, pe, start_n, end, scale_log2,
                     BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, mma: gl.constexpr, CHAINS: gl.constexpr):
        """One online-softmax step over a tile of latent rows in shared memory: each row the key
        (rank and rope parts) and the value (rank part) of every head."""
        dot_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        dot_b: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
        s = _scores(q_r, q_p, kv, pe, BLOCK_H, BLOCK_N, mma, dot_a, dot_b, CHAINS)
        offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
        s = gl.where((offs_n < end)[None, :], s * scale_log2, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + gl.sum(p, 1)
        p_a = gl.convert_layout(p.to(kv.dtype), dot_a)
        return mma_v2(p_a, kv.load(dot_b), acc * alpha[:, None]), l_i, m_new

    @gluon.jit
    def _attend_chunk(Q, Kv, token_row, b, head_block, start, end, scale_log2, stride_qb, stride_qh, stride_kt,
                      NUM_HEADS: gl.constexpr, RANK: gl.constexpr, ROPE: gl.constexpr, BLOCK_H: gl.constexpr,
                      BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr, WARPS: gl.constexpr, CHAINS: gl.constexpr):
        """(acc, l_i, m_i) over keys start..end - 1, NUM_BUF tiles of rows in shared memory."""
        # Heads are the MMA's 16 rows, keys and latent columns split among the warps.
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, WARPS], instr_shape=[16, 8])
        # 16-byte copies, a warp over 4 rows of 64 columns: the rope part fits it exactly.
        copy_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
        slot_layout: gl.constexpr = gl.SliceLayout(1, copy_layout)
        smem: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
        kv_bufs = gl.allocate_shared_memory(Kv.dtype.element_ty, [NUM_BUF, BLOCK_N, RANK], smem)
        pe_bufs = gl.allocate_shared_memory(Kv.dtype.element_ty, [NUM_BUF, BLOCK_N, ROPE], smem)
        # The first NUM_BUF - 1 tiles' copies go out before anything else is read.
        for j in gl.static_range(NUM_BUF - 1):
            slots = _load_slots(token_row, start + j * BLOCK_N, end, BLOCK_N, slot_layout)
            _copy_rows(Kv, kv_bufs.index(j), pe_bufs.index(j), slots, start + j * BLOCK_N, end, stride_kt,
                       RANK, ROPE, BLOCK_N, copy_layout)
        next_slots = _load_slots(token_row, start + (NUM_BUF - 1) * BLOCK_N, end, BLOCK_N, slot_layout)
        q_r, q_p = _load_q(Q, b, head_block, stride_qb, stride_qh, NUM_HEADS, RANK, ROPE, BLOCK_H, copy_layout, smem)

        acc = gl.zeros([BLOCK_H, RANK], gl.float32, mma)
        l_i = gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(1, mma))
        m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(1, mma))
        for i in range(gl.cdiv(end - start, BLOCK_N)):
            # Every warp is done with the buffer read last step before it is refilled.
            cta_barrier()
            ahead = start + (i + NUM_BUF - 1) * BLOCK_N
            fill = (i + NUM_BUF - 1) % NUM_BUF
            _copy_rows(Kv, kv_bufs.index(fill), pe_bufs.index(fill), next_slots, ahead, end, stride_kt,
                       RANK, ROPE, BLOCK_N, copy_layout)
            next_slots = _load_slots(token_row, ahead + BLOCK_N, end, BLOCK_N, slot_layout)
            async_copy.wait_group(NUM_BUF - 1)
            cta_barrier()  # other threads' copies into this tile's buffer landed too
            acc, l_i, m_i = _attend_tile(acc, l_i, m_i, q_r, q_p, kv_bufs.index(i % NUM_BUF),
                                         pe_bufs.index(i % NUM_BUF), start + i * BLOCK_N, end, scale_log2,
                                         BLOCK_H, BLOCK_N, mma, CHAINS)
        async_copy.wait_group(0)  # the copies past the chunk's end, which read nothing
        return acc, l_i, m_i

    @gluon.jit
    def _store_partial(MidOut, MidLse, acc, l_i, m_i, b, head_block, split,
                       stride_mb, stride_mh, stride_ms, stride_lb, stride_lh,
                       NUM_HEADS: gl.constexpr, RANK: gl.constexpr, BLOCK_H: gl.constexpr, WARPS: gl.constexpr):
        """One chunk's normalised output and base-2 log-sum-exp, as triton_decode.store_split."""
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, WARPS], instr_shape=[16, 8])
        heads = head_block * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, mma))
        offs_d = gl.arange(0, RANK, layout=gl.SliceLayout(0, mma))
        gl.store(MidOut + b * stride_mb + heads[:, None] * stride_mh + split * stride_ms + offs_d[None, :],
                 (acc / l_i[:, None]).to(MidOut.dtype.element_ty), mask=(heads < NUM_HEADS)[:, None])
        gl.store(MidLse + b * stride_lb + heads * stride_lh + split, m_i + gl.log2(l_i), mask=heads < NUM_HEADS)

    @gluon.jit
    def _mla_decode_stage1_buffered(
        Q, Kv, MidOut, MidLse, O, Tickets, req_to_token, req_pool_indices, seq_lens, scale_log2,
        stride_qb, stride_qh, stride_kt, stride_req, stride_mb, stride_mh, stride_ms, stride_lb, stride_lh,
        stride_ob, stride_oh,
        NUM_HEADS: gl.constexpr, RANK: gl.constexpr, ROPE: gl.constexpr, BLOCK_H: gl.constexpr,
        BLOCK_N: gl.constexpr, NUM_SPLITS: gl.constexpr, MIN_CHUNK: gl.constexpr, NUM_BUF: gl.constexpr,
        WARPS: gl.constexpr, FUSED_MERGE: gl.constexpr, MERGE_D: gl.constexpr, PDL: gl.constexpr,
        CHAINS: gl.constexpr, RELEASE: gl.constexpr = False,
    ):
        if RELEASE:
            _release_next_kernel()  # the merge kernel's programs, which wait for this launch's end
        if PDL:
            _wait_for_previous_kernel()
        b = gl.program_id(0)
        head_block = gl.program_id(1)
        split = gl.program_id(2)
        seq_len = gl.load(seq_lens + b)
        # Read beside the length, not after it, since the slots wait on both: volatile, or the
        # compiler sinks the load into the branch below, one memory round trip later.
        pool_row = gl.load(req_pool_indices + b, volatile=True)
        keys = _chunk_keys(seq_len, NUM_SPLITS, BLOCK_N, MIN_CHUNK)
        start = split * keys
        end = gl.minimum(start + keys, seq_len)
        if end > start:  # the merge skips empty chunks
            token_row = req_to_token + pool_row.to(gl.int64) * stride_req
            acc, l_i, m_i = _attend_chunk(Q, Kv, token_row, b, head_block, start, end, scale_log2,
                                          stride_qb, stride_qh, stride_kt,
                                          NUM_HEADS, RANK, ROPE, BLOCK_H, BLOCK_N, NUM_BUF, WARPS, CHAINS)
            _store_partial(MidOut, MidLse, acc, l_i, m_i, b, head_block, split,
                           stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, NUM_HEADS, RANK, BLOCK_H, WARPS)
        # As triton_mla's stage 1: the chunks holding keys (chunk 0 always) take a ticket, and
        # the last of a request's head block merges them.
        chunks = gl.maximum(gl.cdiv(seq_len, gl.maximum(keys, 1)), 1)
        if FUSED_MERGE and split < chunks:
            cta_barrier()  # every thread's stores before the release
            ticket = Tickets + b * gl.num_programs(1) + head_block
            drawn = gl.atomic_add(ticket, 1, sem="acq_rel", scope="gpu")
            if drawn == chunks - 1:
                gl.atomic_xchg(ticket, 0, sem="relaxed", scope="gpu")
                _merge_heads(MidOut, MidLse, O, b, head_block, seq_len, keys,
                             stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ob, stride_oh,
                             NUM_HEADS, RANK, BLOCK_H, MERGE_D, NUM_SPLITS, WARPS)


def score_chains(rank: int, fused_merge: bool) -> int:
    """Running sums of q . k a warp keeps (`_scores`): SCORE_CHAINS where the last program
    merges and the rank holds four 32-wide slices, one on the merge kernel's path."""
    return SCORE_CHAINS if fused_merge and rank >= 4 * 32 else 1


def supports(rank: int, rope: int) -> bool:
    """Gluon's tensors are powers of two: the latent's parts must be, each at least 64 wide
    (one copy row of the layout)."""
    return all(n >= 64 and n & (n - 1) == 0 for n in (rank, rope))


def launch_or_refuse(kernel, grid: tuple[int, int, int], refused: list[str], name: str, instead: str,
                     q: torch.Tensor, latent_cache: torch.Tensor, mid_out: torch.Tensor, mid_lse: torch.Tensor,
                     out: torch.Tensor, tickets: torch.Tensor | None, req_to_token: torch.Tensor,
                     req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, scale_log2: float, **constexprs) -> bool:
    """Launches a Gluon stage 1 (this module's or gluon_mla_wgmma's, whose arguments are the
    same but for their constexprs). False, having launched nothing, where this Triton refuses to
    compile it: the compiler's last line goes to `refused`, with one RuntimeWarning naming the
    kernel that serves `instead`."""
    try:
        kernel[grid](
            q, latent_cache, mid_out, mid_lse, out, mid_lse if tickets is None else tickets,
            req_to_token, req_pool_indices, seq_lens, scale_log2,
            q.stride(0), q.stride(1), latent_cache.stride(0), req_to_token.stride(0),
            mid_out.stride(0), mid_out.stride(1), mid_out.stride(2), mid_lse.stride(0), mid_lse.stride(1),
            out.stride(0), out.stride(1), **constexprs,
        )
    except CompilationError as err:
        refused.append(str(err).strip().splitlines()[-1])
        warnings.warn(f"cgtool: this Triton refused {name}'s MLA decode kernel ({refused[-1]}); "
                      f"{instead}'s kernel serves instead", RuntimeWarning, stacklevel=3)
        return False
    return True


def launch_stage1(
    q: torch.Tensor, latent_cache: torch.Tensor, mid_out: torch.Tensor, mid_lse: torch.Tensor, out: torch.Tensor,
    tickets: torch.Tensor | None, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor, scale_log2: float, block_h: int, num_kv_splits: int, min_chunk: int,
    block_n: int, num_buf: int, num_warps: int, merge_d: int, chains: int | None = None,
) -> bool:
    """Stage 1 over grid (bs, head blocks, chunks), its partials in `mid_out`/`mid_lse` as
    triton_mla's stage 1 writes them; with `tickets` (one a request's head block, at zero) the
    last program of a request's chunks merges them into `out`, as triton_mla's fused merge.
    Launched as a programmatic dependent where dependent launches run (runtime.dependent_launch):
    in a model the store of the step's new rows (kv_store) releases it at once, and it waits
    for that store before reading anything; without tickets it releases the merge kernel, its
    own dependent, at its start (RELEASE_MERGE_AT_START). `chains`: the running sums of q . k a
    warp keeps (1 or 4; default `score_chains`).

    False, having launched nothing, where this Triton refuses to compile the kernel (Gluon's
    names move between releases: 3.6's `thread_barrier` is 3.9's `barrier`); from then on
    `available` says no and triton_mla's kernel serves, with one RuntimeWarning."""
    bs, num_heads, width = q.shape
    rank = out.shape[-1]
    grid = (bs, cdiv(num_heads, block_h), num_kv_splits)
    launch = dependent_launch(q.device)
    return launch_or_refuse(
        _mla_decode_stage1_buffered, grid, _REFUSED, "gluon_mla", "triton_mla",
        q, latent_cache, mid_out, mid_lse, out, tickets, req_to_token, req_pool_indices, seq_lens, scale_log2,
        NUM_HEADS=num_heads, RANK=rank, ROPE=width - rank, BLOCK_H=block_h, BLOCK_N=block_n,
        NUM_SPLITS=num_kv_splits, MIN_CHUNK=min_chunk, NUM_BUF=num_buf, WARPS=num_warps,
        FUSED_MERGE=tickets is not None, MERGE_D=merge_d, CHAINS=chains or score_chains(rank, tickets is not None),
        num_warps=num_warps, **launch, RELEASE=RELEASE_MERGE_AT_START and launch["PDL"] and tickets is None,
    )
