"""One token's whole MoE layer in one launch: router, routing, gate/up with SiLU, down, top-k sum.

At bs 1 the layer had been three launches (`moe_routing.router_route`, then the direct path's
two grouped GEMMs), and a replayed graph pays some microseconds at every kernel boundary
whatever the work: qwen3-30b-a3b's layer ran 29.8 us against 17.8 for reading its eight
experts (H200, docs/moe-mla.md). Here one grid plays the three parts in turn, in order of
program id: the first programs compute the router's logits and the last of them routes the
token; the gate/up programs wait for the routing; the down programs wait for their pair's
gate/up tiles, and the last down program over a column tile sums the top-k rows.

A program only ever waits for programs with lower ids. The GPU hands out programs in id order,
so every program waited for is running or done (the same forward-progress assumption as a
single-pass scan with decoupled look-back), and Triton's interpreter runs programs one after
another in id order, so the CPU tests never wait at all. The counters live in the shared
ticket buffer (runtime.tickets) and the launch's last program puts them back to zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from cgtool.model.moe_routing import (
    ROUTER_ROUTE_K,
    ROUTER_ROUTE_PROGRAMS,
    _route_if_last,
    _router_logits_one,
)
from cgtool.model.moe_triton import MIN_BLOCK_M, _gemm_tile, _sum_top_k_last
from cgtool.runtime.tickets import tickets
from cgtool.runtime.triton_launch import CachedKernel, cdiv, next_power_of_2

ONE_TOKEN = 1  # the batch this launch serves: a decode step of one request
# Counters at the start of the ticket buffer; the pairs' gate/up tile counts follow, then one
# ticket a down column tile for the top-k sum.
# (tl.constexpr: the only globals a kernel may read)
ROUTER_TICKET, ROUTED, FINISHED, PAIR_TILES = (tl.constexpr(i) for i in range(4))


@dataclass(frozen=True)
class OneTokenTiles:
    up_n: int  # gate (and up) columns a gate/up program computes
    up_k: int
    down_n: int
    down_k: int
    num_warps: int
    num_stages: int


# The direct path's tiles (moe_triton.DIRECT_CONFIG: 32 gate/up columns, K 128 deep over four
# stages), with 64 down columns so that both GEMMs' pipelines fit two programs an SM.
ONE_TOKEN_TILES = OneTokenTiles(32, 128, 64, 128, 4, 4)


@triton.jit
def _wait_until(Counter, target):
    """Spins until the counter reaches target; the acquire makes the writes it counts visible."""
    seen = tl.atomic_add(Counter, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = tl.atomic_add(Counter, 0, sem="acquire", scope="gpu")


@triton.jit
def _up_part(
    X, GateUp, Ids, Act, Sync, q, hidden, inter, stride_ge, stride_gn,
    UP_TILES: tl.constexpr, UP_N: tl.constexpr, UP_K: tl.constexpr, EVEN_UP_K: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
):
    # Pairs one after another, so a pair's tiles finish together and its down programs start.
    pair = q // UP_TILES
    offs_n = (q % UP_TILES) * UP_N + tl.arange(0, UP_N)
    mask_n = offs_n < inter
    rows = tl.arange(0, BLOCK_M)
    _wait_until(Sync + ROUTED, 1)
    expert = tl.load(Ids + pair, cache_modifier=".cg").to(tl.int64)
    acc = _gemm_tile(X, GateUp, rows * 0, rows == 0, expert, offs_n, mask_n, inter, hidden, 0,
                     stride_ge, stride_gn, True, PRECISION, EVEN_UP_K, False,
                     Act.dtype.element_ty, BLOCK_M, UP_N, UP_K)
    ptrs = Act + pair * inter + rows[:, None] * 0 + offs_n[None, :]
    tl.store(ptrs, acc.to(Act.dtype.element_ty), mask=(rows == 0)[:, None] & mask_n[None, :])
    tl.debug_barrier()  # the tile stored before the count's release
    tl.atomic_add(Sync + PAIR_TILES + pair, 1, sem="release", scope="gpu")


@triton.jit
def _down_part(
    Down, Weights, Ids, Act, Y, Out, Sync, q, hidden, inter, stride_de, stride_dn,
    TOP_K: tl.constexpr, UP_TILES: tl.constexpr, DOWN_N: tl.constexpr, DOWN_K: tl.constexpr,
    EVEN_DOWN_K: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
):
    # A column tile's TOP_K programs one after another, so its sum starts early.
    pair = q % TOP_K
    tile = q // TOP_K
    offs_n = tile * DOWN_N + tl.arange(0, DOWN_N)
    mask_n = offs_n < hidden
    rows = tl.arange(0, BLOCK_M)
    _wait_until(Sync + PAIR_TILES + pair, UP_TILES)
    expert = tl.load(Ids + pair, cache_modifier=".cg").to(tl.int64)
    acc = _gemm_tile(Act, Down, pair + rows * 0, rows == 0, expert, offs_n, mask_n, hidden, inter,
                     inter, stride_de, stride_dn, False, PRECISION, EVEN_DOWN_K, True,
                     Y.dtype.element_ty, BLOCK_M, DOWN_N, DOWN_K)
    acc = acc * tl.load(Weights + pair, cache_modifier=".cg")
    ptrs = Y + pair * hidden + rows[:, None] * 0 + offs_n[None, :]
    tl.store(ptrs, acc, mask=(rows == 0)[:, None] & mask_n[None, :])
    token = tl.full((), 0, tl.int32)  # the only one
    _sum_top_k_last(Y, Out, Sync + PAIR_TILES + TOP_K + tile, token, offs_n, mask_n, hidden, hidden,
                    TOP_K, DOWN_N)


@triton.jit
def _one_token_moe_kernel(
    X, RouterW, GateUp, Down, Logits, Weights, Ids, Act, Y, Out, Sync,
    hidden, inter, stride_rw, stride_ge, stride_gn, stride_de, stride_dn, scale,
    NUM_EXPERTS: tl.constexpr, ALL_EXPERTS: tl.constexpr, TOP_K: tl.constexpr, RENORM: tl.constexpr,
    ROUTER_PROGRAMS: tl.constexpr, BLOCK_E: tl.constexpr, ROUTER_K: tl.constexpr,
    UP_TILES: tl.constexpr, UP_N: tl.constexpr, UP_K: tl.constexpr, EVEN_UP_K: tl.constexpr,
    DOWN_N: tl.constexpr, DOWN_K: tl.constexpr, EVEN_DOWN_K: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
):
    pid = tl.program_id(0)
    down_start = ROUTER_PROGRAMS + TOP_K * UP_TILES
    if pid < ROUTER_PROGRAMS:
        _router_logits_one(X, RouterW, Logits, hidden, stride_rw, NUM_EXPERTS, BLOCK_E, ROUTER_K)
        if _route_if_last(Logits, Weights, Ids, Sync + ROUTER_TICKET, ROUTER_PROGRAMS, scale,
                          NUM_EXPERTS, ALL_EXPERTS, TOP_K, RENORM):
            tl.debug_barrier()  # the routing stored before the flag's release
            tl.atomic_xchg(Sync + ROUTED, 1, sem="release", scope="gpu")
    elif pid < down_start:
        _up_part(X, GateUp, Ids, Act, Sync, pid - ROUTER_PROGRAMS, hidden, inter, stride_ge, stride_gn,
                 UP_TILES, UP_N, UP_K, EVEN_UP_K, PRECISION, BLOCK_M)
    else:
        _down_part(Down, Weights, Ids, Act, Y, Out, Sync, pid - down_start, hidden, inter, stride_de,
                   stride_dn, TOP_K, UP_TILES, DOWN_N, DOWN_K, EVEN_DOWN_K, PRECISION, BLOCK_M)
    # The last program of the launch puts the wait counters back to zero for the next one.
    tl.debug_barrier()
    if tl.atomic_add(Sync + FINISHED, 1, sem="acq_rel", scope="gpu") == tl.num_programs(0) - 1:
        tl.atomic_xchg(Sync + ROUTED, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(Sync + FINISHED, 0, sem="relaxed", scope="gpu")
        for j in tl.static_range(TOP_K):
            tl.atomic_xchg(Sync + PAIR_TILES + j, 0, sem="relaxed", scope="gpu")


_ONE_TOKEN_MOE = CachedKernel(_one_token_moe_kernel)


def one_token_moe_launch(
    x: torch.Tensor, router_weight: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
    top_k: int, renormalise: bool, scale: float, tiles: OneTokenTiles = ONE_TOKEN_TILES,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The routed experts' output for one token [1, hidden], with the routing's fp32 weights
    and int32 ids [1, top_k]: `moe.route` of the fp32 router logits, then `experts_ref`."""
    assert x.shape[0] == ONE_TOKEN and x.stride(-1) == 1 and router_weight.stride(-1) == 1
    assert gate_up.stride(-1) == 1 and down.stride(-1) == 1
    num_experts, hidden = router_weight.shape
    inter = gate_up.shape[1] // 2
    block_e = next_power_of_2(cdiv(num_experts, ROUTER_ROUTE_PROGRAMS))
    router_programs = cdiv(num_experts, block_e)
    up_tiles, down_tiles = cdiv(inter, tiles.up_n), cdiv(hidden, tiles.down_n)
    up_k = min(tiles.up_k, max(16, next_power_of_2(hidden)))
    down_k = min(tiles.down_k, max(16, next_power_of_2(inter)))
    new = lambda *shape, dtype=x.dtype: torch.empty(shape, dtype=dtype, device=x.device)
    logits, weights = new(num_experts, dtype=torch.float32), new(1, top_k, dtype=torch.float32)
    ids, act = new(1, top_k, dtype=torch.int32), new(top_k, inter)
    y, out = new(top_k, hidden, dtype=torch.float32), new(1, hidden)
    sync = tickets(x.device, PAIR_TILES.value + top_k + down_tiles)
    grid = (router_programs + top_k * (up_tiles + down_tiles),)
    _ONE_TOKEN_MOE.launch(
        grid, x, router_weight, gate_up, down, logits, weights, ids, act, y, out, sync,
        hidden, inter, router_weight.stride(0), gate_up.stride(0), gate_up.stride(1),
        down.stride(0), down.stride(1), float(scale),
        NUM_EXPERTS=num_experts, ALL_EXPERTS=next_power_of_2(num_experts), TOP_K=top_k,
        RENORM=renormalise, ROUTER_PROGRAMS=router_programs, BLOCK_E=block_e,
        ROUTER_K=min(ROUTER_ROUTE_K, next_power_of_2(hidden)),
        UP_TILES=up_tiles, UP_N=tiles.up_n, UP_K=up_k, EVEN_UP_K=hidden % up_k == 0,
        DOWN_N=tiles.down_n, DOWN_K=down_k, EVEN_DOWN_K=inter % down_k == 0,
        # fp32 weights take exact fp32 products: TF32 would drift from the reference.
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32", BLOCK_M=MIN_BLOCK_M,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )
    return out, weights, ids


def one_token_moe(
    x: torch.Tensor, router_weight: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
    top_k: int, renormalise: bool, scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(routed experts' output [1, hidden], int32 ids [1, top_k]) in one launch; one opaque node
    for dynamo."""
    if torch.compiler.is_compiling():
        return torch.ops.cgtool.one_token_moe(x, router_weight, gate_up, down, top_k, renormalise, scale)
    out, _, ids = one_token_moe_launch(x, router_weight, gate_up, down, top_k, renormalise, scale)
    return out, ids


@torch.library.custom_op("cgtool::one_token_moe", mutates_args=())
def _one_token_moe_op(
    x: torch.Tensor, router_weight: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
    top_k: int, renormalise: bool, scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    out, _, ids = one_token_moe_launch(x, router_weight, gate_up, down, top_k, renormalise, scale)
    return out, ids


@_one_token_moe_op.register_fake
def _(
    x: torch.Tensor, router_weight: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
    top_k: int, renormalise: bool, scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape), x.new_empty((x.shape[0], top_k), dtype=torch.int32)
