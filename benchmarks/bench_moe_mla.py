"""Issue 33: the MoE and MLA kernels of qwen3-30b-a3b and deepseek-v2-lite against their limits.

Every figure is a replayed CUDA graph over LAYERS layers of distinct weights (so one layer's
weights are not read from L2 by the next), divided per layer. Limits are measured here: the
device-to-device copy bandwidth and the throughput of one large bf16 torch.mm.

- MoE at decode bs 1/8/64/256 and extend 512/2048/8192 tokens, per component (router GEMM,
  routing, alignment, gate/up GEMM with SiLU, down GEMM, top-k sum), the pre-issue path
  beside it (torch routing and alignment, untuned tiles, separate SiLU and sum), and a sweep
  of tile configs for each GEMM. Roofline: the distinct experts the batch routed to, read at
  the copy bandwidth, or the pairs' FLOPs at the torch.mm rate, whichever is longer.
- MLA decode at bs 1/64/256 over 1k and 8k-token contexts, a sweep of tiles and split counts;
  roofline: the latent rows read at the copy bandwidth. MLA extend of 512-8192 new tokens,
  with and without a cached prefix, against the torch.mm rate.

    python3 benchmarks/bench_moe_mla.py --out results.json [--no-sweep] [--parts mla,moe]
        [--sweep-parts moe,moe-direct,mla] [--mla-cases 32x1024,48x2048] [--dry]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from cgtool.attention.triton_mla import (
    EXTEND_TILES,
    mla_decode_attention,
    mla_extend_attention,
    mla_num_kv_splits,
)
from cgtool.model.fused import silu_and_mul
from cgtool.model.fused_launch import launch_rms_norm
from cgtool.model.moe import experts_ref
from cgtool.model.moe_routing import (
    ROUTER_ROUTE_TOKENS,
    align_block_size,
    route_topk,
    router_logits,
    router_route,
)
from cgtool.model.moe_triton import (
    CONFIGS,
    DIRECT,
    DIRECT_CONFIG,
    MIN_BLOCK_M,
    ExpertsConfig,
    GemmTiles,
    combine_top_k,
    direct_align,
    experts_config,
    fused_experts,
    grouped_gemm,
)
from cgtool.runtime import dependent_launch
from cgtool.runtime.triton_launch import cdiv

DTYPE = torch.bfloat16
LAYERS = 6
DEVICE = "cuda"
# The state a process's graphs replay in (benchmarks/results/h200-2026-11-28-graph-gaps): "fast"
# runs the timed function eagerly after its capture, "slow" captures a one-kernel graph after it,
# "as_is" (every figure before 2026-11-28 afternoon) leaves whichever the capture set.
GRAPH_STATE = os.environ.get("BENCH_GRAPH_STATE", "as_is")
# name: (experts, top_k, hidden, expert width, renormalise)
MOE = {"qwen3-30b-a3b": (128, 8, 2048, 768, True), "deepseek-v2-lite": (64, 6, 2048, 1408, False)}
MLA_HEADS, RANK, ROPE = 16, 512, 64  # deepseek-v2-lite
DECODE_BS, EXTEND_TOKENS = [1, 8, 64, 256], [512, 2048, 8192]
MLA_DECODE = [(bs, ctx) for bs in (1, 16, 32, 64, 256) for ctx in (1024, 8192)]
MLA_EXTEND = [(512, 0), (2048, 0), (8192, 0), (2048, 6144)]  # (new tokens, cached prefix)
OLD_TILES = GemmTiles(64, 64, 4, 3)  # before issue 33: 64x64 tiles, Triton's default 3 stages
SMALL_UP = [GemmTiles(16, 128, 4, 4), GemmTiles(32, 128, 4, 4), GemmTiles(32, 256, 4, 3),
            GemmTiles(64, 128, 4, 4), GemmTiles(32, 64, 4, 5), GemmTiles(64, 64, 4, 3)]
SMALL_DOWN = [GemmTiles(32, 128, 4, 4), GemmTiles(64, 128, 4, 4), GemmTiles(64, 256, 4, 3),
              GemmTiles(128, 128, 8, 4), GemmTiles(64, 64, 4, 3), GemmTiles(32, 256, 4, 4)]
LARGE_UP = [GemmTiles(64, 64, 4, 4), GemmTiles(64, 64, 8, 4), GemmTiles(128, 64, 8, 3),
            GemmTiles(64, 128, 8, 3), GemmTiles(128, 64, 8, 4), GemmTiles(128, 64, 4, 4),
            GemmTiles(128, 32, 8, 5), GemmTiles(256, 64, 8, 2), GemmTiles(128, 128, 8, 2)]
LARGE_DOWN = [GemmTiles(128, 64, 8, 4), GemmTiles(128, 128, 8, 3), GemmTiles(64, 64, 4, 4),
              GemmTiles(256, 64, 8, 3), GemmTiles(128, 64, 4, 4), GemmTiles(256, 64, 8, 4),
              GemmTiles(256, 32, 8, 5), GemmTiles(128, 128, 4, 3), GemmTiles(256, 128, 8, 2)]
# The direct path (one token): the gate/up and down tiles tried, and experts a router program.
DIRECT_UP = [GemmTiles(64, 128, 4, 4), GemmTiles(32, 128, 4, 4), GemmTiles(32, 256, 4, 3),
             GemmTiles(16, 256, 4, 4), GemmTiles(32, 128, 2, 6), GemmTiles(64, 256, 4, 3),
             GemmTiles(16, 128, 2, 8), GemmTiles(32, 128, 8, 4), GemmTiles(32, 64, 4, 8),
             GemmTiles(64, 128, 8, 4), GemmTiles(32, 256, 8, 3)]
DIRECT_DOWN = [GemmTiles(64, 128, 4, 4), GemmTiles(32, 128, 4, 4), GemmTiles(128, 128, 4, 4),
               GemmTiles(64, 256, 4, 3), GemmTiles(32, 256, 4, 4), GemmTiles(64, 64, 4, 6),
               GemmTiles(128, 64, 4, 6), GemmTiles(128, 128, 8, 4), GemmTiles(256, 64, 8, 4),
               GemmTiles(128, 64, 4, 8)]
ROUTER_BLOCKS_E = [1, 2, 4, 8]
ROUTER_WARPS = [2, 4, 8]


def save_results(result: dict, out: str) -> None:
    """Writes what is measured so far, so a later size's failure loses nothing."""
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def graph_us(fn: Callable[[], object], iters: int = 20) -> float:
    """Microseconds of one replay of `fn` captured as a CUDA graph (median of 3 runs)."""
    if DEVICE == "cpu":  # --dry: the script's logic in Triton's interpreter, timings meaningless
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e6
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    set_graph_state(fn)
    graph.replay()
    runs = [replay_us(graph, iters) for _ in range(3)]
    del graph
    return sorted(runs)[1]


def set_graph_state(fn: Callable[[], object]) -> None:
    """Put the process in GRAPH_STATE's state, by the events that set it in the graph-gap probes."""
    if GRAPH_STATE == "fast":
        fn()
    elif GRAPH_STATE == "slow":
        one = torch.zeros(1, device=DEVICE)
        tiny = torch.cuda.CUDAGraph()
        with torch.cuda.graph(tiny):
            one.add_(1)
    elif GRAPH_STATE != "as_is":
        raise SystemExit(f"BENCH_GRAPH_STATE={GRAPH_STATE!r}: use fast, slow or as_is")
    torch.cuda.synchronize()


def replay_us(graph: torch.cuda.CUDAGraph, iters: int) -> float:
    """Microseconds of one replay of a captured graph, over `iters` back to back."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


def copy_bandwidth() -> float:
    """capture's own figure (an eager copy kernel): a copy captured in a graph becomes a memcpy
    node on the copy engines, which read 2.7 TB/s on the H200 where the kernel read 4.2."""
    if DEVICE == "cpu":
        return 1e12
    from cgtool.capture.timing import copy_bandwidth_bytes_s

    return copy_bandwidth_bytes_s()


def mm_flops() -> float:
    if DEVICE == "cpu":
        return 1e15
    a = torch.randn(8192, 8192, device=DEVICE, dtype=DTYPE)
    b = torch.randn(8192, 8192, device=DEVICE, dtype=DTYPE)
    return 2 * 8192**3 / graph_us(lambda: a @ b, iters=10) * 1e6


# ------------------------------------------------------------------ the pre-issue path


def old_align(ids: torch.Tensor, num_experts: int, block_m: int):
    """The torch-op alignment cgtool ran before issue 33 (about 25 kernels)."""
    experts = ids.flatten().long()
    num_pairs, device = experts.numel(), ids.device
    counts = torch.zeros(num_experts, dtype=torch.long, device=device)
    counts.scatter_add_(0, experts, torch.ones_like(experts))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_ends = padded.cumsum(0)
    order = torch.argsort(experts, stable=True)
    sorted_experts = experts[order]
    first_of_expert = counts.cumsum(0) - counts
    rank = torch.arange(num_pairs, device=device) - first_of_expert[sorted_experts]
    dest = (padded_ends - padded)[sorted_experts] + rank
    padded_max = num_pairs + min(num_experts, num_pairs) * (block_m - 1)
    max_padded = cdiv(padded_max, block_m) * block_m
    sorted_pair_ids = torch.full((max_padded,), num_pairs, dtype=torch.int32, device=device)
    sorted_pair_ids.scatter_(0, dest, order.int())
    block_starts = torch.arange(0, max_padded, block_m, device=device)
    block_experts = torch.searchsorted(padded_ends, block_starts, right=True)
    return sorted_pair_ids, block_experts.clamp_max(num_experts - 1).int(), padded_ends[-1:].int()


def old_route(logits: torch.Tensor, top_k: int, renorm: bool):
    probs = logits.float().softmax(dim=-1)
    weights, ids = probs.topk(top_k, dim=-1)
    if renorm:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights * 1.0, ids


def old_block_m(num_pairs: int, num_experts: int) -> int:
    mean = 1 << max(0, (cdiv(num_pairs, num_experts) - 1).bit_length())
    return max(16, min(64, mean))


# ------------------------------------------------------------------ MoE


class MoeLayers:
    def __init__(self, name: str) -> None:
        self.E, self.k, self.H, self.I, self.renorm = MOE[name]
        gen = torch.Generator(device=DEVICE).manual_seed(0)
        self.router = [torch.randn(self.E, self.H, device=DEVICE, generator=gen).to(DTYPE) * self.H**-0.5
                       for _ in range(LAYERS)]
        self.gate_up = [(torch.rand(self.E, 2 * self.I, self.H, device=DEVICE, generator=gen) - 0.5)
                        .to(DTYPE) * self.H**-0.5 for _ in range(LAYERS)]
        self.down = [(torch.rand(self.E, self.H, self.I, device=DEVICE, generator=gen) - 0.5)
                     .to(DTYPE) * self.I**-0.5 for _ in range(LAYERS)]
        self.expert_bytes = 3 * self.H * self.I * DTYPE.itemsize

    def batch(self, n: int):
        x = torch.randn(n, self.H, device=DEVICE).to(DTYPE)
        logits = [router_logits(x, w) for w in self.router]
        routed = [route_topk(lg, self.k, self.renorm, 1.0) for lg in logits]
        return x, logits, routed


def moe_case(layers: MoeLayers, n: int, copy_bs: float, peak: float, sweep: bool) -> dict:
    x, logits, routed = layers.batch(n)
    E, k, H, I = layers.E, layers.k, layers.H, layers.I
    pairs = n * k
    distinct = sum(int(ids.unique().numel()) for _, ids in routed) / LAYERS
    read_us = (distinct * layers.expert_bytes + pairs * (H + I) * 6) / copy_bs * 1e6
    flops = pairs * 3 * H * I * 2
    bound_us = max(read_us, flops / peak * 1e6)
    config = experts_config(pairs, E, n)
    direct = config.block_m == DIRECT
    bm = MIN_BLOCK_M if direct else config.block_m
    aligns = [direct_align(ids) if direct else align_block_size(ids, E, bm) for _, ids in routed]
    act = torch.empty(pairs, I, dtype=DTYPE, device=DEVICE)
    y = torch.empty(pairs, H, dtype=torch.float32, device=DEVICE)
    summed = torch.empty(n, H, dtype=DTYPE, device=DEVICE)
    row: dict = {"tokens": n, "pairs": pairs, "distinct_experts": distinct, "read_us": read_us,
                 "flop_us": flops / peak * 1e6, "bound_us": bound_us, "config": str(config)}

    def up(tiles, bm=bm, al=aligns):
        return lambda: [grouped_gemm(x, layers.gate_up[i], act, al[i], routed[i][0], k, bm, tiles,
                                     mul_weight=False, gated=True) for i in range(LAYERS)]

    def down(tiles, bm=bm, al=aligns, with_sum=direct):
        return lambda: [grouped_gemm(act, layers.down[i], y, al[i], routed[i][0], 1, bm, tiles,
                                     mul_weight=True, gated=False, summed=summed if with_sum else None,
                                     top_k=k) for i in range(LAYERS)]

    def experts(cfg=None):
        return lambda: [fused_experts(x, layers.gate_up[i], layers.down[i], *routed[i], cfg)
                        for i in range(LAYERS)]

    def fused_router(block_e, warps=4):
        return lambda: [router_route(x, w, k, layers.renorm, 1.0, block_e, warps) for w in layers.router]

    per = lambda fn: graph_us(fn) / LAYERS
    row["router_gemm_us"] = per(lambda: [router_logits(x, w) for w in layers.router])
    row["old_router_gemm_us"] = per(lambda: [F.linear(x.float(), w.float()) for w in layers.router])
    row["route_us"] = per(lambda: [route_topk(lg, k, layers.renorm, 1.0) for lg in logits])
    if n <= ROUTER_ROUTE_TOKENS:  # router and routing in one launch
        row["router_route_us"] = per(fused_router(None))
        one_graph_layers(row, layers, x, per, experts, fused_router)
    row["align_us"] = 0.0 if direct else per(lambda: [align_block_size(ids, E, bm) for _, ids in routed])
    row["up_us"], row["down_us"] = per(up(config.up)), per(down(config.down))
    row["combine_us"] = 0.0 if direct else per(lambda: [combine_top_k(y, k, DTYPE) for _ in range(LAYERS)])
    experts_us = per(experts())
    routing_us = row.get("router_route_us", row["router_gemm_us"] + row["route_us"])
    row["layer_us"] = routing_us + experts_us
    if n <= 8:  # the direct path against the aligned one at a few tokens
        row["aligned_layer_us"] = row["router_gemm_us"] + row["route_us"] + per(experts(CONFIGS[0][1]))
        row["direct_layer_us"] = routing_us + per(experts(DIRECT_CONFIG))
    # the pre-issue path, component by component
    bm0 = old_block_m(pairs, E)
    olds = [old_align(ids, E, bm0) for _, ids in routed]
    h = torch.empty(pairs, 2 * I, dtype=DTYPE, device=DEVICE)
    row["old_route_us"] = per(lambda: [old_route(lg, k, layers.renorm) for lg in logits])
    row["old_align_us"] = per(lambda: [old_align(ids, E, bm0) for _, ids in routed])
    row["old_up_us"] = per(lambda: [grouped_gemm(x, layers.gate_up[i], h, olds[i], routed[i][0], k, bm0,
                                                 GemmTiles(64, 64, 4, 3), mul_weight=False, gated=False)
                                    for i in range(LAYERS)])
    row["old_silu_us"] = per(lambda: [silu_and_mul(h) for _ in range(LAYERS)])
    row["old_down_us"] = per(lambda: [grouped_gemm(act, layers.down[i], y, olds[i], routed[i][0], 1, bm0,
                                                   OLD_TILES, mul_weight=True, gated=False) for i in range(LAYERS)])
    row["old_sum_us"] = per(lambda: [y.view(n, k, H).sum(dim=1).to(DTYPE) for _ in range(LAYERS)])
    row["old_layer_us"] = row["old_router_gemm_us"] + sum(row[f"old_{c}_us"] for c in
                                                      ("route", "align", "up", "silu", "down", "sum"))
    # equality with the reference (bf16 kernel against the fp32 reference of the same inputs)
    w0, ids0 = routed[0]
    ref = experts_ref(x[:64].float(), layers.gate_up[0].float(), layers.down[0].float(), w0[:64], ids0[:64].long())
    got = fused_experts(x[:64], layers.gate_up[0], layers.down[0], w0[:64], ids0[:64]).float()
    row["max_abs_err_vs_ref"] = float((got - ref).abs().max())
    if sweep:
        row["sweep"] = direct_sweep(up, down, fused_router, per) if direct else tile_sweep(
            layers, routed, pairs, config, up, down, per)
    if sweep and direct:  # the layer again with the sweep's best of each kernel
        best = {g: min((r for r in row["sweep"] if r["gemm"] == g), key=lambda r: r["us"])["tiles"]
                for g in ("up", "down", "router")}
        cfg = ExpertsConfig(DIRECT, GemmTiles(*best["up"]), GemmTiles(*best["down"]))
        row["best_layer_us"] = per(fused_router(*best["router"])) + per(experts(cfg))
        row["default_layer_again_us"] = per(fused_router(None)) + per(experts())
    return row


def one_graph_layers(row: dict, layers: MoeLayers, x: torch.Tensor, per, experts, fused_router) -> None:
    """One token's layer with its router in one graph, its launches programmatic dependents
    (the default on Hopper) and ordinary, in interleaved rounds (the median of each): back to
    back ("one_graph"), and each layer after an RMSNorm of its input ("after_norm"), an ordinary
    launch, as in a model, where the router follows the post-attention norm; the norms alone;
    and the parts' graphs summed, ordinary."""
    norm_weight = torch.ones(layers.H, dtype=DTYPE, device=DEVICE)

    def whole(norm: bool):
        def run():
            outs = []
            for i in range(LAYERS):
                h = launch_rms_norm(x, None, norm_weight, 1e-6)[0] if norm else x
                outs.append(fused_experts(h, layers.gate_up[i], layers.down[i],
                                          *router_route(h, layers.router[i], layers.k, layers.renorm, 1.0)))
            return outs
        return run

    try:
        times: dict[str, list[float]] = {f"{shape}_{mode}": [] for shape in ("one_graph", "after_norm")
                                         for mode in ("dependent", "ordinary")}
        for _ in range(3):
            for name, got in times.items():
                dependent_launch.DEPENDENT_LAUNCH = name.endswith("dependent")
                got.append(per(whole(name.startswith("after_norm"))))
        for name, got in times.items():
            row[f"{name}_layer_us"] = sorted(got)[1]
            row[f"{name}_layer_rounds_us"] = got
        dependent_launch.DEPENDENT_LAUNCH = False
        row["norms_alone_us"] = per(lambda: [launch_rms_norm(x, None, norm_weight, 1e-6) for _ in range(LAYERS)])
        row["layer_ordinary_us"] = per(fused_router(None)) + per(experts())
    finally:
        dependent_launch.DEPENDENT_LAUNCH = True


def direct_sweep(up, down, fused_router, per) -> list[dict]:
    rows = [{"gemm": "up", "block_m": DIRECT, "tiles": list(vars(t).values()), "us": per(up(t))}
            for t in DIRECT_UP]
    rows += [{"gemm": "down", "block_m": DIRECT, "tiles": list(vars(t).values()), "us": per(down(t))}
             for t in DIRECT_DOWN]
    rows += [{"gemm": "router", "block_m": DIRECT, "tiles": [e, w], "us": per(fused_router(e, w))}
             for e in ROUTER_BLOCKS_E for w in ROUTER_WARPS]
    return rows


def tile_sweep(layers, routed, pairs, config: ExpertsConfig, up, down, per) -> list[dict]:
    E = layers.E
    small = config.block_m <= 32
    rows = []
    for bm in ([config.block_m, 32] if small and pairs / E >= 8 else
               [config.block_m] if small else [64, 128] + ([32] if pairs / E < 64 else [])):
        al = [align_block_size(ids, E, bm) for _, ids in routed]
        for tiles in (SMALL_UP if small else LARGE_UP):
            rows.append({"gemm": "up", "block_m": bm, "tiles": list(vars(tiles).values()),
                         "us": per(up(tiles, bm, al))})
        for tiles in (SMALL_DOWN if small else LARGE_DOWN):
            rows.append({"gemm": "down", "block_m": bm, "tiles": list(vars(tiles).values()),
                         "us": per(down(tiles, bm, al))})
    return rows


# ------------------------------------------------------------------ MLA


def latent_setup(lens: list[int], layers: int):
    bs, width = len(lens), max(lens)
    slots = sum(lens) + 1
    caches = [torch.randn(slots, 1, RANK + ROPE, device=DEVICE).to(DTYPE) for _ in range(layers)]
    req_to_token = torch.zeros(bs + 1, width, dtype=torch.int32, device=DEVICE)
    start = 1
    for b, n in enumerate(lens):
        req_to_token[b + 1, :n] = torch.arange(start, start + n, dtype=torch.int32, device=DEVICE)
        start += n
    rows = torch.arange(1, bs + 1, dtype=torch.int32, device=DEVICE)
    return caches, req_to_token, rows


def mla_decode_case(bs: int, ctx: int, copy_bs: float, sweep: bool) -> dict:
    layers = 2 if bs * ctx >= 64 * 8192 else LAYERS
    caches, r2t, rows = latent_setup([ctx] * bs, layers)
    seq_lens = torch.full((bs,), ctx, dtype=torch.int32, device=DEVICE)
    q = torch.randn(bs, MLA_HEADS, RANK + ROPE, device=DEVICE).to(DTYPE)
    out = torch.empty(bs, MLA_HEADS, RANK, device=DEVICE, dtype=DTYPE)
    bound_us = bs * ctx * (RANK + ROPE) * DTYPE.itemsize / copy_bs * 1e6
    default_splits = mla_num_kv_splits(bs, MLA_HEADS)

    def run(tiles, splits, fused=None):
        return graph_us(lambda: [mla_decode_attention(q, c, out, r2t, rows, seq_lens, 0.07, splits, None,
                                                      tiles, fused) for c in caches]) / layers

    row = {"bs": bs, "context": ctx, "bound_us": bound_us, "splits": default_splits,
           "us": run(None, default_splits)}
    if sweep:
        tried = []
        for tiles in [(64, 8, 2), (64, 4, 2), (32, 4, 3), (32, 4, 4)]:
            for splits in sorted({default_splits, 1, 2, 4, 8, 16} if bs >= 16 else {8, 16, 32, 64}):
                for fused in ((False, True) if splits <= 8 else (False,)):
                    tried.append({"tiles": list(tiles), "splits": splits, "fused": fused,
                                  "us": run(tiles, splits, fused)})
        row["sweep"] = tried
    return row


def mla_extend_case(new: int, prefix: int, peak: float, sweep: bool) -> dict:
    caches, r2t, rows = latent_setup([prefix + new], 2)
    q = torch.randn(new, MLA_HEADS, RANK + ROPE, device=DEVICE).to(DTYPE)
    out = torch.empty(new, MLA_HEADS, RANK, device=DEVICE, dtype=DTYPE)
    lens = [torch.tensor([v], dtype=torch.int32, device=DEVICE) for v in (prefix, new, 0)]
    pairs = new * (new + 1) / 2 + new * prefix
    flops = MLA_HEADS * pairs * 2 * (RANK + ROPE + RANK)

    def run(tiles):
        return graph_us(lambda: [mla_extend_attention(q, c, out, r2t, rows[:1], *lens, 0.07, new, tiles)
                                 for c in caches], iters=5) / 2

    row = {"new_tokens": new, "prefix": prefix, "flop_us": flops / peak * 1e6, "us": run(EXTEND_TILES)}
    if sweep:
        row["sweep"] = [{"tiles": list(t), "us": run(t)} for t in
                        [(64, 32, 8, 2), (64, 64, 8, 2), (32, 64, 8, 2), (64, 32, 4, 2), (128, 32, 8, 2), (32, 32, 4, 2)]]
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--no-sweep", action="store_true")
    parser.add_argument("--parts", default="moe,mla")
    parser.add_argument("--sweep-parts", default="moe,mla", help="where to sweep: moe, moe-direct (bs 1 only), mla")
    parser.add_argument("--dry", action="store_true", help="tiny shapes on the CPU (TRITON_INTERPRET=1)")
    parser.add_argument("--moe-tokens", help="MoE token counts to run, comma-separated (default: all)")
    parser.add_argument("--mla-cases", help="MLA decode BSxCONTEXT cases, comma-separated; MLA extend is then skipped")
    args = parser.parse_args()
    if args.mla_cases:
        MLA_DECODE[:] = [tuple(int(v) for v in case.split("x")) for case in args.mla_cases.split(",")]
        MLA_EXTEND[:] = []
    if args.moe_tokens:
        wanted = [int(n) for n in args.moe_tokens.split(",")]
        DECODE_BS[:], EXTEND_TOKENS[:] = [n for n in wanted if n <= 256], [n for n in wanted if n > 256]
    sweep = not args.no_sweep
    if args.dry:
        global DEVICE, DTYPE, LAYERS, MLA_HEADS, RANK, ROPE
        DEVICE, DTYPE, LAYERS, MLA_HEADS, RANK, ROPE = "cpu", torch.float32, 2, 4, 32, 16
        MOE.update({"qwen3-30b-a3b": (16, 4, 64, 32, True), "deepseek-v2-lite": (8, 3, 64, 48, False)})
        DECODE_BS[:], EXTEND_TOKENS[:] = [1, 33], [300]
        MLA_DECODE[:], MLA_EXTEND[:] = [(2, 70)], [(40, 0), (20, 30)]
    copy_bs, peak = copy_bandwidth(), mm_flops()
    result: dict = {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", "date": time.strftime("%Y-%m-%d"),
                    "copy_bytes_s": copy_bs, "mm_flops": peak, "layers": LAYERS, "moe": {}, "mla": {}}
    log(f"{result['device']}: copy {copy_bs / 1e9:.0f} GB/s, bf16 mm {peak / 1e12:.0f} TFLOP/s")
    if "mla" in args.parts:
        result["mla"]["decode"] = []
        for bs, ctx in MLA_DECODE:
            row = mla_decode_case(bs, ctx, copy_bs, sweep and "mla" in args.sweep_parts)
            result["mla"]["decode"].append(row)
            best = min(row.get("sweep", [row]), key=lambda s: s["us"])
            log(f"mla decode bs={bs} ctx={ctx}: {row['us']:.1f} us, bound {row['bound_us']:.1f} us = "
                f"{100 * row['bound_us'] / row['us']:.0f}%; best {best}")
            torch.cuda.empty_cache()
        json.dump(result, open(args.out, "w"), indent=1)
        result["mla"]["extend"] = []
        for new, prefix in MLA_EXTEND:
            row = mla_extend_case(new, prefix, peak, False)  # no MLA extend change to sweep
            result["mla"]["extend"].append(row)
            best = min(row.get("sweep", [row]), key=lambda s: s["us"])
            log(f"mla extend new={new} prefix={prefix}: {row['us']:.1f} us, flops bound {row['flop_us']:.1f} us = "
                f"{100 * row['flop_us'] / row['us']:.0f}%; best {best}")
        json.dump(result, open(args.out, "w"), indent=1)
    if "moe" in args.parts:
        for name in MOE:
            layers = MoeLayers(name)
            rows = []
            for n in DECODE_BS + EXTEND_TOKENS:
                row = moe_case(layers, n, copy_bs, peak, sweep and (
                    "moe" in args.sweep_parts.replace("moe-direct", "") or ("moe-direct" in args.sweep_parts and n == 1)))
                rows.append(row)
                log(f"moe {name} n={n}: layer {row['layer_us']:.1f} us (old {row['old_layer_us']:.1f}), "
                    f"bound {row['bound_us']:.1f} us = {100 * row['bound_us'] / row['layer_us']:.0f}%; "
                    + ", ".join(f"{c} {row[c + '_us']:.1f}" for c in
                                ("router_gemm", "route", "align", "up", "down", "combine"))
                    + "; old: " + ", ".join(f"{c} {row['old_' + c + '_us']:.1f}" for c in
                                             ("route", "align", "up", "silu", "down", "sum"))
                    + f"; err {row['max_abs_err_vs_ref']:.3g}")
                for gemm in ("up", "down", "router"):
                    tried = [s for s in row.get("sweep", []) if s["gemm"] == gemm]
                    if tried:
                        s = min(tried, key=lambda s: s["us"])
                        log(f"   best {gemm}: bm {s['block_m']} tiles {s['tiles']} {s['us']:.1f} us")
                if "one_graph_dependent_layer_us" in row:
                    log("   one graph, router and experts, dependent / ordinary launches: back to back "
                        f"{row['one_graph_dependent_layer_us']:.1f} / {row['one_graph_ordinary_layer_us']:.1f} us, "
                        f"after a norm {row['after_norm_dependent_layer_us']:.1f} / "
                        f"{row['after_norm_ordinary_layer_us']:.1f} us (the norm alone "
                        f"{row['norms_alone_us']:.1f}); parts summed ordinary {row['layer_ordinary_us']:.1f}")
                if "best_layer_us" in row:
                    log(f"   layer with the best of each: {row['best_layer_us']:.1f} us, "
                        f"default again {row['default_layer_again_us']:.1f} us")
            result["moe"][name] = rows
            del layers
            torch.cuda.empty_cache()
            json.dump(result, open(args.out, "w"), indent=1)
    log("done")


if __name__ == "__main__":
    sys.exit(main())
