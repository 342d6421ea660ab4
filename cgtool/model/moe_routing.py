"""Routing and block alignment for the fused MoE, each one Triton launch or a few.

Issue 33's breakdown (docs/moe-mla.md): at decode sizes the MoE layer was mostly launches.
Routing took six torch kernels (softmax, top-k, sum, divide, scale, a cast) and aligning the
pairs to blocks about 25 (scatter_add, cumsum, argsort, searchsorted and the index arithmetic
between them), each a few microseconds of a replay whatever the batch, 48 layers a step.

`route_topk` is softmax, top k, renormalisation and scaling in one kernel; for one token
`router_route` computes the router's logits too, in the same launch. `align_block_size`
sorts (token, slot) pairs by expert into blocks of block_m rows, as SGLang's and vLLM's
moe_align_block_size kernels do: count each expert's pairs, scan the padded counts into run
starts, then place each pair at its expert's cursor with an atomic increment. Up to
ONE_PROGRAM_PAIRS pairs one program does it all (one launch); past that the counting and
placing spread over many programs (four launches). The order of pairs inside an expert's run
follows the atomics and may change from call to call; each pair's output row is computed from
its own row alone, so results do not.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cgtool.runtime.dependent_launch import (
    dependent_launch,
    release_next_kernel,
    wait_for_previous_kernel,
)
from cgtool.runtime.tickets import tickets
from cgtool.runtime.triton_launch import CachedKernel, cdiv, next_power_of_2

# One program aligns this many pairs (decode up to bs 512 at top 8) in one launch; past it the
# work is spread so an 8k-token extend's 64k pairs do not queue behind one SM.
ONE_PROGRAM_PAIRS = 4096
PAIRS_BLOCK = 1024
BLOCKS_BLOCK = 64
# A batch of this many tokens (one) takes the router's logits and the routing in one launch
# (router_route), over ROUTER_ROUTE_PROGRAMS programs and ROUTER_ROUTE_K-wide slices of the
# hidden size: 4.9 and 3.9 us for qwen3-30b-a3b's 128 and deepseek-v2-lite's 64 experts, where
# the two kernels took 9.7 and 9.3 (H200, 2026-11-26, call5).
ROUTER_ROUTE_TOKENS = 1
ROUTER_ROUTE_PROGRAMS = 32
ROUTER_ROUTE_K = 2048
ROUTER_ROUTE_WARPS = 4


@triton.jit
def _router_kernel(
    X, W, Logits, num_tokens, hidden, stride_xt, stride_we,
    NUM_EXPERTS: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # Logits[t, e] = x[t] . w[e] with fp32 accumulation. A bf16 product is exact in fp32, so
    # this is the reference's fp32 GEMM of the upcast tensors but for the order of the sum.
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    experts = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    mask_t = tokens < num_tokens
    mask_e = experts < NUM_EXPERTS
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_T, BLOCK_E), dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        mask_k = offs_k < hidden - k0
        x = tl.load(X + tokens[:, None].to(tl.int64) * stride_xt + k0 + offs_k[None, :],
                    mask=mask_t[:, None] & mask_k[None, :], other=0.0)
        w = tl.load(W + experts[None, :] * stride_we + k0 + offs_k[:, None],
                    mask=mask_e[None, :] & mask_k[:, None], other=0.0)
        acc = tl.dot(x, w, acc, input_precision=PRECISION)
    tl.store(Logits + tokens[:, None] * NUM_EXPERTS + experts[None, :], acc,
             mask=mask_t[:, None] & mask_e[None, :])


_ROUTER = CachedKernel(_router_kernel)


def router_logits(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """fp32 [n, E] logits of `F.linear(x.float(), weight.float())` in one kernel, where torch
    takes three (two casts and an fp32 GEMM on the CUDA cores: 155 us at 8k tokens, H200)."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    assert weight.stride(-1) == 1
    num_tokens, hidden = x.shape
    num_experts = weight.shape[0]
    logits = torch.empty((num_tokens, num_experts), dtype=torch.float32, device=x.device)
    block_t = 16 if num_tokens <= 64 else 64  # tl.dot takes 16 rows at the least
    block_e = min(64, max(16, next_power_of_2(num_experts))) if num_tokens > 64 else 16
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    _ROUTER.launch(
        (cdiv(num_tokens, block_t), cdiv(num_experts, block_e)), x, weight, logits, num_tokens,
        hidden, x.stride(0), weight.stride(0), NUM_EXPERTS=num_experts, PRECISION=precision,
        BLOCK_T=block_t, BLOCK_E=block_e, BLOCK_K=128, num_warps=4,
    )
    return logits


@triton.jit
def _route_kernel(
    Logits, Weights, Ids, num_tokens, scale,
    NUM_EXPERTS: tl.constexpr, BLOCK_E: tl.constexpr, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr,
    RENORM: tl.constexpr, BLOCK_T: tl.constexpr,
):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    mask_t = tokens < num_tokens
    offs_e = tl.arange(0, BLOCK_E)
    is_expert = offs_e[None, :] < NUM_EXPERTS
    logits = tl.load(
        Logits + tokens[:, None] * NUM_EXPERTS + offs_e[None, :], mask=mask_t[:, None] & is_expert,
        other=0.0,
    )
    logits = tl.where(is_expert, logits, float("-inf"))  # rows past the batch stay finite
    p = tl.exp(logits - tl.max(logits, axis=1)[:, None])
    p = p / tl.sum(p, axis=1)[:, None]
    offs_k = tl.arange(0, BLOCK_K)
    weights = tl.zeros((BLOCK_T, BLOCK_K), dtype=tl.float32)
    ids = tl.zeros((BLOCK_T, BLOCK_K), dtype=tl.int32)
    for j in tl.static_range(TOP_K):  # k rounds of argmax: descending, as torch.topk sorts
        best = tl.argmax(p, axis=1, tie_break_left=True)
        weights = tl.where(offs_k[None, :] == j, tl.max(p, axis=1)[:, None], weights)
        ids = tl.where(offs_k[None, :] == j, best[:, None].to(tl.int32), ids)
        p = tl.where(offs_e[None, :] == best[:, None], -1.0, p)
    if RENORM:
        weights = weights / tl.sum(weights, axis=1)[:, None]
    mask = mask_t[:, None] & (offs_k[None, :] < TOP_K)
    out = tokens[:, None] * TOP_K + offs_k[None, :]
    tl.store(Weights + out, weights * scale, mask=mask)
    tl.store(Ids + out, ids, mask=mask)


@triton.jit
def _route_one_by_rank(
    Logits, Weights, Ids, scale,
    NUM_EXPERTS: tl.constexpr, BLOCK_E: tl.constexpr, TOP_K: tl.constexpr, RENORM: tl.constexpr,
):
    """`_route_kernel` for one token in a few reductions: each expert's place in the descending
    order is the count of experts ahead of it (higher probability, or equal and a lower index,
    as k rounds of argmax break ties), and the top k are stored at their places. The rounds of
    argmax cost two block-wide reductions each, serial in the program that finishes last."""
    offs_e = tl.arange(0, BLOCK_E)
    is_expert = offs_e < NUM_EXPERTS
    logits = tl.load(Logits + offs_e, mask=is_expert, other=float("-inf"), cache_modifier=".cg")
    p = tl.exp(logits - tl.max(logits, axis=0))
    p = p / tl.sum(p, axis=0)
    other = offs_e[None, :]
    ahead = (p[None, :] > p[:, None]) | ((p[None, :] == p[:, None]) & (other < offs_e[:, None]))
    place = tl.sum(ahead.to(tl.int32), axis=1)
    chosen = is_expert & (place < TOP_K)
    weights = p
    if RENORM:
        weights = p / tl.sum(tl.where(chosen, p, 0.0), axis=0)
    tl.store(Weights + place, weights * scale, mask=chosen)
    tl.store(Ids + place, offs_e, mask=chosen)


@triton.jit
def _router_route_kernel(
    X, W, Logits, Weights, Ids, Tickets, hidden, stride_we, scale,
    NUM_EXPERTS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
    ALL_EXPERTS: tl.constexpr, TOP_K: tl.constexpr, RENORM: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_previous_kernel(PDL)
    # One token: each program takes BLOCK_E experts, products on the CUDA cores (tl.dot would
    # pad the token to 16 rows and leave most SMs idle) over hidden slices of BLOCK_K (the
    # whole row at once where it fits: a loop of loads without a dot is not pipelined), then
    # the last program to finish routes the token (runtime.tickets): one launch, not two.
    experts = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    mask_e = experts < NUM_EXPERTS
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_E,), dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        mask_k = offs_k < hidden - k0
        x = tl.load(X + k0 + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        w = tl.load(W + experts[:, None] * stride_we + k0 + offs_k[None, :],
                    mask=mask_e[:, None] & mask_k[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(x[None, :] * w, axis=1)
    release_next_kernel(PDL)
    tl.store(Logits + experts, acc, mask=mask_e)
    tl.debug_barrier()  # every thread's logits stored before the ticket's release
    if tl.atomic_add(Tickets, 1, sem="acq_rel", scope="gpu") == tl.num_programs(0) - 1:
        tl.atomic_xchg(Tickets, 0, sem="relaxed", scope="gpu")
        _route_one_by_rank(Logits, Weights, Ids, scale, NUM_EXPERTS, ALL_EXPERTS, TOP_K, RENORM)


_ROUTE = CachedKernel(_route_kernel)
_ROUTER_ROUTE = CachedKernel(_router_route_kernel)


def route_topk(
    logits: torch.Tensor, top_k: int, renormalise: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`moe.route` of fp32 router logits [n, E]: (fp32 weights [n, k], int32 ids [n, k])."""
    logits = logits.float().contiguous()
    num_tokens, num_experts = logits.shape
    weights = torch.empty((num_tokens, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((num_tokens, top_k), dtype=torch.int32, device=logits.device)
    block_e = next_power_of_2(num_experts)
    # Up to 16 tokens a program at large batches; a decode step of a few tokens takes one
    # program each (bs 1 ran 6.9 us on 16-token programs with 128 experts, H200).
    block_t = max(1, min(16, 2048 // block_e, next_power_of_2(cdiv(num_tokens, 132))))
    _ROUTE.launch(
        (cdiv(num_tokens, block_t),), logits, weights, ids, num_tokens, float(scale),
        NUM_EXPERTS=num_experts, BLOCK_E=block_e, TOP_K=top_k,
        BLOCK_K=next_power_of_2(top_k), RENORM=renormalise, BLOCK_T=block_t, num_warps=4,
    )
    return weights, ids


@triton.jit
def _count_pairs(Ids, Counts, start, num_pairs, BLOCK: tl.constexpr):
    offs = start + tl.arange(0, BLOCK)
    mask = offs < num_pairs
    experts = tl.load(Ids + offs, mask=mask, other=0)
    tl.atomic_add(Counts + experts, 1, mask=mask)


@triton.jit
def _place_pairs(Ids, Cursor, SortedPairIds, start, num_pairs, BLOCK: tl.constexpr):
    offs = start + tl.arange(0, BLOCK)
    mask = offs < num_pairs
    experts = tl.load(Ids + offs, mask=mask, other=0)
    dest = tl.atomic_add(Cursor + experts, 1, mask=mask)
    tl.store(SortedPairIds + dest, offs, mask=mask)


@triton.jit
def _scan_experts(
    Counts, Cursor, BlockExperts, NumPadded, SortedPairIds, num_pairs, max_padded,
    NUM_EXPERTS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCKS_BLOCK: tl.constexpr, FILL: tl.constexpr, FILL_BLOCK: tl.constexpr,
):
    """Each expert's run start into Cursor, the aligned length, every block's expert; with
    FILL, every row of sorted_pair_ids set to the padding index first."""
    offs_e = tl.arange(0, BLOCK_E)
    mask_e = offs_e < NUM_EXPERTS
    counts = tl.load(Counts + offs_e, mask=mask_e, other=0, volatile=True)  # atomics wrote them
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    tl.store(Cursor + offs_e, ends - padded, mask=mask_e)
    tl.store(NumPadded, tl.sum(padded, axis=0))
    # A block's expert is the number of runs that end at or before its first row; blocks past
    # the aligned length come out as NUM_EXPERTS, clamped, and never run.
    for b0 in range(0, max_padded // BLOCK_M, BLOCKS_BLOCK):
        blocks = b0 + tl.arange(0, BLOCKS_BLOCK)
        ended = (ends[None, :] <= blocks[:, None] * BLOCK_M) & mask_e[None, :]
        expert = tl.minimum(tl.sum(ended.to(tl.int32), axis=1), NUM_EXPERTS - 1)
        tl.store(BlockExperts + blocks, expert, mask=blocks < max_padded // BLOCK_M)
    if FILL:
        for p0 in range(0, max_padded, FILL_BLOCK):
            offs = p0 + tl.arange(0, FILL_BLOCK)
            tl.store(SortedPairIds + offs, num_pairs, mask=offs < max_padded)


@triton.jit
def _align_one_program(
    Ids, Counts, Cursor, SortedPairIds, BlockExperts, NumPadded, num_pairs, max_padded,
    NUM_EXPERTS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCKS_BLOCK: tl.constexpr, BLOCK: tl.constexpr,
):
    offs_e = tl.arange(0, BLOCK_E)
    tl.store(Counts + offs_e, tl.zeros((BLOCK_E,), dtype=tl.int32), mask=offs_e < NUM_EXPERTS)
    tl.debug_barrier()  # one program: a barrier orders its phases
    for start in range(0, num_pairs, BLOCK):
        _count_pairs(Ids, Counts, start, num_pairs, BLOCK)
    tl.debug_barrier()
    _scan_experts(
        Counts, Cursor, BlockExperts, NumPadded, SortedPairIds, num_pairs, max_padded,
        NUM_EXPERTS, BLOCK_E, BLOCK_M, BLOCKS_BLOCK, True, BLOCK,
    )
    tl.debug_barrier()
    for start in range(0, num_pairs, BLOCK):
        _place_pairs(Ids, Cursor, SortedPairIds, start, num_pairs, BLOCK)


@triton.jit
def _count_kernel(Ids, Counts, num_pairs, BLOCK: tl.constexpr):
    _count_pairs(Ids, Counts, tl.program_id(0) * BLOCK, num_pairs, BLOCK)


@triton.jit
def _scan_kernel(
    Counts, Cursor, BlockExperts, NumPadded, SortedPairIds, num_pairs, max_padded,
    NUM_EXPERTS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCKS_BLOCK: tl.constexpr,
):
    _scan_experts(
        Counts, Cursor, BlockExperts, NumPadded, SortedPairIds, num_pairs, max_padded,
        NUM_EXPERTS, BLOCK_E, BLOCK_M, BLOCKS_BLOCK, False, 16,
    )


@triton.jit
def _place_kernel(Ids, Cursor, SortedPairIds, num_pairs, BLOCK: tl.constexpr):
    _place_pairs(Ids, Cursor, SortedPairIds, tl.program_id(0) * BLOCK, num_pairs, BLOCK)


_ALIGN_ONE = CachedKernel(_align_one_program)
_COUNT = CachedKernel(_count_kernel)
_SCAN = CachedKernel(_scan_kernel)
_PLACE = CachedKernel(_place_kernel)


def max_padded_pairs(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Worst case of the aligned length: each expert that gets a pair (at most one per pair)
    pads its rows by up to block_m - 1."""
    padded = num_pairs + min(num_experts, num_pairs) * (block_m - 1)
    return cdiv(padded, block_m) * block_m


def align_block_size(
    ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sorted_pair_ids, block_experts, num_padded) for expert ids [n, top_k].

    sorted_pair_ids [max_padded]: flat pair indices (token * top_k + slot) grouped by expert,
    each expert's run padded to a multiple of block_m with n * top_k, an index past the end.
    block_experts [max_padded / block_m]: the expert of each block.
    num_padded [1]: the aligned length in use; the blocks past it hold only padding.
    Shapes follow the pair count alone and nothing is read on the host, so it captures.
    """
    flat = ids.reshape(-1)
    flat = flat if flat.dtype == torch.int32 else flat.int()
    num_pairs, device = flat.numel(), ids.device
    max_padded = max_padded_pairs(num_pairs, num_experts, block_m)
    block_e = next_power_of_2(num_experts)
    counters = torch.empty(2 * block_e, dtype=torch.int32, device=device)  # counts, cursors
    counts, cursor = counters[:block_e], counters[block_e:]
    block_experts = torch.empty(max_padded // block_m, dtype=torch.int32, device=device)
    num_padded = torch.empty(1, dtype=torch.int32, device=device)
    meta = {"NUM_EXPERTS": num_experts, "BLOCK_E": block_e, "BLOCK_M": block_m,
            "BLOCKS_BLOCK": BLOCKS_BLOCK}
    if num_pairs <= ONE_PROGRAM_PAIRS:
        sorted_pair_ids = torch.empty(max_padded, dtype=torch.int32, device=device)
        _ALIGN_ONE.launch(
            (1,), flat, counts, cursor, sorted_pair_ids, block_experts, num_padded, num_pairs,
            max_padded, **meta, BLOCK=min(PAIRS_BLOCK, next_power_of_2(num_pairs)), num_warps=4,
        )
        return sorted_pair_ids, block_experts, num_padded
    sorted_pair_ids = torch.full((max_padded,), num_pairs, dtype=torch.int32, device=device)
    counts.zero_()
    grid = (cdiv(num_pairs, PAIRS_BLOCK),)
    _COUNT.launch(grid, flat, counts, num_pairs, BLOCK=PAIRS_BLOCK, num_warps=4)
    _SCAN.launch(
        (1,), counts, cursor, block_experts, num_padded, sorted_pair_ids, num_pairs, max_padded,
        **meta, num_warps=4,
    )
    _PLACE.launch(grid, flat, cursor, sorted_pair_ids, num_pairs, BLOCK=PAIRS_BLOCK, num_warps=4)
    return sorted_pair_ids, block_experts, num_padded


def fused_route(
    x: torch.Tensor, weight: torch.Tensor, top_k: int, renormalise: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`moe.route` of the router's logits for x: two kernels, one opaque node for dynamo."""
    if torch.compiler.is_compiling():
        return torch.ops.cgtool.route_topk(x, weight, top_k, renormalise, scale)
    return _fused_route(x, weight, top_k, renormalise, scale)


def _fused_route(
    x: torch.Tensor, weight: torch.Tensor, top_k: int, renormalise: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    if x.shape[0] == ROUTER_ROUTE_TOKENS:
        return router_route(x if x.stride(-1) == 1 else x.contiguous(), weight, top_k, renormalise, scale)
    return route_topk(router_logits(x, weight), top_k, renormalise, scale)


def router_route(
    x: torch.Tensor, weight: torch.Tensor, top_k: int, renormalise: bool, scale: float,
    block_e: int | None = None, num_warps: int = ROUTER_ROUTE_WARPS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`route_topk(router_logits(x, weight), ...)` of one token in one launch; `block_e`
    experts a program (by default ROUTER_ROUTE_PROGRAMS programs) and `num_warps` for
    benchmarks."""
    assert x.shape[0] == ROUTER_ROUTE_TOKENS and x.stride(-1) == 1 and weight.stride(-1) == 1
    hidden, num_experts = x.shape[1], weight.shape[0]
    block_e = block_e or next_power_of_2(cdiv(num_experts, ROUTER_ROUTE_PROGRAMS))
    logits = torch.empty((1, num_experts), dtype=torch.float32, device=x.device)
    weights = torch.empty((1, top_k), dtype=torch.float32, device=x.device)
    ids = torch.empty((1, top_k), dtype=torch.int32, device=x.device)
    _ROUTER_ROUTE.launch(
        (cdiv(num_experts, block_e),), x, weight, logits, weights, ids, tickets(x.device, 1),
        hidden, weight.stride(0), float(scale),
        NUM_EXPERTS=num_experts, BLOCK_E=block_e, BLOCK_K=min(ROUTER_ROUTE_K, next_power_of_2(hidden)),
        ALL_EXPERTS=next_power_of_2(num_experts), TOP_K=top_k, RENORM=renormalise,
        **dependent_launch(x.device), num_warps=num_warps,
    )
    return weights, ids


@torch.library.custom_op("cgtool::route_topk", mutates_args=())
def _route_topk_op(
    x: torch.Tensor, weight: torch.Tensor, top_k: int, renormalise: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return _fused_route(x, weight, top_k, renormalise, scale)


@_route_topk_op.register_fake
def _(
    x: torch.Tensor, weight: torch.Tensor, top_k: int, renormalise: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (x.shape[0], top_k)
    return (x.new_empty(shape, dtype=torch.float32), x.new_empty(shape, dtype=torch.int32))
