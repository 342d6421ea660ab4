"""Issue 33: MoE experts at extend sizes on the grouped path against cgtool's Triton path.

For qwen3-30b-a3b's and deepseek-v2-lite's shapes at 256-16,384 tokens: the experts (router
excluded) on the Triton path (`moe_triton`, the tiles the shapes choose) and on the grouped
path (`moe_grouped`: a counting sort and cgtool's TMA grouped GEMMs since 2026-11-26 13:00 UTC,
torch.sort and torch's grouped GEMM before; both GEMMs' parts are timed), each a replayed CUDA graph over bench_moe_mla's six layers of distinct
weights, per layer; the grouped path's parts; both paths' error against the fp32 reference on
the first 256 tokens; the grouped path's replay against its eager call (bits); and the peak
memory of one eager call of each. Roofline as bench_moe_mla's: the distinct experts' weights
at the copy bandwidth or the pairs' FLOPs at one 8192^3 torch.mm, whichever is longer.

    python3 benchmarks/bench_moe_grouped.py --out grouped.json
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from bench_moe_mla import (  # benchmarks/ is the script's path
    DTYPE,
    LAYERS,
    MOE,
    MoeLayers,
    copy_bandwidth,
    graph_us,
    log,
    mm_flops,
    save_results,
)

from cgtool.model import moe_grouped
from cgtool.model.moe import experts_ref
from cgtool.model.moe_grouped import (
    _GROUPED_MM,
    gather_rows,
    grouped_mm_experts,
    silu_mul_weight,
    sort_pairs,
    sum_sorted_rows,
)
from cgtool.model.moe_routing import route_topk, router_logits
from cgtool.model.moe_tma_gemm import launch_tiles, tma_grouped_mm
from cgtool.model.moe_triton import experts_config, fused_experts

TOKENS = [256, 512, 1024, 2048, 4096, 8192, 16384]
CHECK_TOKENS = 256
TAIL_VARIANTS = {"none": {"tail": False, "narrow_tail": False, "tile_order": 0},
                 "half": {"tail": True, "narrow_tail": False, "tile_order": 0},
                 "narrow": {"tail": True, "narrow_tail": True, "tile_order": 0},
                 "none_3_stages": {"tail": False, "narrow_tail": False, "num_stages": 3, "tile_order": 0},
                 "narrow_3_stages": {"tail": True, "narrow_tail": True, "num_stages": 3, "tile_order": 0},
                 # the gate/up GEMM's tiles in expert-major order (`moe_tma_gemm._expert_major_tile`);
                 # "down" names the down GEMM's settings
                 "narrow_expert_major": {"tail": True, "narrow_tail": True, "tile_order": 1},
                 "half_expert_major": {"tail": True, "narrow_tail": False, "tile_order": 1},
                 "none_expert_major": {"tail": False, "narrow_tail": False, "tile_order": 1},
                 "none_3_expert_major": {"tail": False, "narrow_tail": False, "num_stages": 3, "tile_order": 1},
                 # 256-row tiles 64 columns wide in the gate/up GEMM (bench_moe_tma --tall-tiles)
                 "tall_expert_major": {"block_m": 256, "block_n": 64, "tail": False, "narrow_tail": False,
                                       "tile_order": 1},
                 "tall_narrow_expert_major": {"block_m": 256, "block_n": 64, "tail": True, "narrow_tail": True,
                                              "tile_order": 1},
                 # a program a tile, both GEMMs (the persistent loop runs once a program)
                 "none_expert_major_all_programs": {"tail": False, "narrow_tail": False, "tile_order": 1,
                                                    "num_programs": 1 << 24,
                                                    "down": {"num_programs": 1 << 24, "flatten": False}},
                 "none_expert_major_both": {"tail": False, "narrow_tail": False, "tile_order": 1,
                                            "down": {"tile_order": 1}},
                 # the gate's and the up's weights in one box and one product (`joint_gate_up`;
                 # named pair_* in benchmarks/results/h200-h100-2026-11-27-moe-joint); until 2b652db
                 # also riding rows (`ride_expert_major*`, slower)
                 "joint_expert_major": {"tail": False, "narrow_tail": False, "tile_order": 1, "joint_gate_up": True},
                 "joint_3_expert_major": {"tail": False, "narrow_tail": False, "tile_order": 1, "joint_gate_up": True,
                                          "num_stages": 3},
                 # K steps of 128 at 2 stages: in the gate/up GEMM, the down GEMM, or both
                 "joint_bk128": {"tail": False, "narrow_tail": False, "tile_order": 1, "joint_gate_up": True,
                                 "block_k": 128, "num_stages": 2},
                 "joint_down_bk128": {"tail": False, "narrow_tail": False, "tile_order": 1, "joint_gate_up": True,
                                      "down": {"block_k": 128, "num_stages": 2}},
                 "joint_bk128_both": {"tail": False, "narrow_tail": False, "tile_order": 1, "joint_gate_up": True,
                                      "block_k": 128, "num_stages": 2, "down": {"block_k": 128, "num_stages": 2}}}
DEFAULT_VARIANTS = "none,half,narrow,none_3_stages,narrow_3_stages"


def argsort_pairs(ids: torch.Tensor, num_experts: int):
    """The first version's sort (call 1): int64 argsort, counts by scatter_add, a cumsum."""
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    inverse = torch.empty_like(order).scatter_(0, order, torch.arange(flat.numel(), device=flat.device))
    counts = torch.zeros(num_experts, dtype=torch.int32, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    return order, inverse, counts.cumsum(0, dtype=torch.int32)


def torch_sort_pairs(ids: torch.Tensor, num_experts: int):
    """The sort before the counting sort (calls 2-4): int32 torch.sort, the inverse by scatter,
    searchsorted for the ends."""
    flat = ids.reshape(-1).int()
    keys, order = torch.sort(flat, stable=True)
    inverse = torch.empty_like(order).scatter_(0, order, torch.arange(flat.numel(), device=flat.device))
    experts = torch.arange(num_experts, dtype=torch.int32, device=flat.device)
    return order, inverse, torch.searchsorted(keys, experts, right=True, out_int32=True)


def peak_bytes(fn) -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def case(layers: MoeLayers, n: int, copy_bs: float, peak: float, rounds: int = 1,
         variants: tuple[str, ...] = tuple(DEFAULT_VARIANTS.split(","))) -> dict:
    x, _, routed = layers.batch(n)
    E, k, H, I = layers.E, layers.k, layers.H, layers.I
    pairs = n * k
    distinct = sum(int(ids.unique().numel()) for _, ids in routed) / LAYERS
    read_us = (distinct * layers.expert_bytes + pairs * (H + I) * 6) / copy_bs * 1e6
    flop_us = pairs * 3 * H * I * 2 / peak * 1e6
    config = experts_config(pairs, E, n)
    per = lambda fn: graph_us(fn) / LAYERS
    row: dict = {"tokens": n, "pairs": pairs, "distinct_experts": distinct, "read_us": read_us,
                 "flop_us": flop_us, "bound_us": max(read_us, flop_us), "triton_config": str(config)}
    row["routing_us"] = per(lambda: [route_topk(router_logits(x, w), k, layers.renorm, 1.0) for w in layers.router])
    row["triton_us"] = per(lambda: [fused_experts(x, layers.gate_up[i], layers.down[i], *routed[i], config)
                                    for i in range(LAYERS)])
    row["grouped_us"] = per(lambda: [grouped_mm_experts(x, layers.gate_up[i], layers.down[i], *routed[i])
                                     for i in range(LAYERS)])
    # the grouped path's parts
    sorts = [sort_pairs(ids, E) for _, ids in routed]
    rows = x.index_select(0, sorts[0][0] // k)
    h = _GROUPED_MM(rows, layers.gate_up[0].transpose(1, 2), offs=sorts[0][2])
    act = torch.empty(pairs, I, dtype=DTYPE, device=x.device)
    row["sort_us"] = per(lambda: [sort_pairs(ids, E) for _, ids in routed])
    row["argsort_us"] = per(lambda: [argsort_pairs(ids, E) for _, ids in routed])
    row["torch_sort_us"] = per(lambda: [torch_sort_pairs(ids, E) for _, ids in routed])
    row["gather_us"] = per(lambda: [gather_rows(x, s[0], k) for s in sorts])
    row["index_select_us"] = per(lambda: [x.index_select(0, s[0] // k) for s in sorts])
    row["up_mm_us"] = per(lambda: [_GROUPED_MM(rows, layers.gate_up[i].transpose(1, 2), offs=sorts[i][2])
                                   for i in range(LAYERS)])
    flat_weights = [w.float().reshape(-1) for w, _ in routed]
    row["silu_us"] = per(lambda: [silu_mul_weight(h, flat_weights[i], sorts[i][0]) for i in range(LAYERS)])
    row["down_mm_us"] = per(lambda: [_GROUPED_MM(act, layers.down[i].transpose(1, 2), offs=sorts[i][2])
                                     for i in range(LAYERS)])
    y = _GROUPED_MM(act, layers.down[0].transpose(1, 2), offs=sorts[0][2])
    row["sum_us"] = per(lambda: [sum_sorted_rows(y, sorts[i][1], k, DTYPE) for i in range(LAYERS)])
    gated_tiles, down_tiles = launch_tiles(x.device.index, pairs / E)
    eager_default = grouped_mm_experts(x, layers.gate_up[0], layers.down[0], *routed[0])
    # the path's gate/up GEMM reads its rows from the tokens (no gather)
    row["tma_gated_us"] = per(lambda: [tma_grouped_mm(x, layers.gate_up[i], sorts[i][2], gated=True,
                                                      pair_weights=flat_weights[i], order=sorts[i][0],
                                                      gather_top_k=k, **gated_tiles) for i in range(LAYERS)])
    row["tma_down_us"] = per(lambda: [tma_grouped_mm(act, layers.down[i], sorts[i][2], **down_tiles)
                                      for i in range(LAYERS)])
    # the whole grouped path again with each kind of tail in the gate/up GEMM (and depth),
    # whatever this GPU's settings: none, half-height, narrow (at most 32 rows in transposed
    # 32-wide tiles); `rounds` rounds, each timing every variant in turn, the median kept
    def with_tiles(extra: dict, fn):
        # two products unless the variant names the joint form
        gated = {"joint_gate_up": False, **{key: value for key, value in extra.items() if key != "down"}}
        moe_grouped.launch_tiles = lambda index, mean_rows: ({**gated_tiles, **gated}, {**down_tiles, **extra.get("down", {})})
        try:
            return fn()
        finally:
            moe_grouped.launch_tiles = launch_tiles

    layer = lambda: [grouped_mm_experts(x, layers.gate_up[i], layers.down[i], *routed[i]) for i in range(LAYERS)]
    chosen = {name: TAIL_VARIANTS[name] for name in variants}
    timed: dict[str, list[float]] = {name: [] for name in chosen}
    for _ in range(rounds):
        for name, extra in chosen.items():
            timed[name].append(row["routing_us"] + with_tiles(extra, lambda: per(layer)))
    for name, extra in chosen.items():
        row[f"grouped_{name}_layer_us"] = statistics.median(timed[name])
        row[f"grouped_{name}_rounds_us"] = timed[name]
        row[f"grouped_{name}_equals_default"] = bool(torch.equal(with_tiles(extra, lambda: grouped_mm_experts(
            x, layers.gate_up[0], layers.down[0], *routed[0])), eager_default))
    row["tma_gated_tflops"] = pairs * 2 * H * I * 2 / row["tma_gated_us"] / 1e6
    row["tma_down_tflops"] = pairs * H * I * 2 / row["tma_down_us"] / 1e6
    row["up_mm_tflops"] = pairs * 2 * H * I * 2 / row["up_mm_us"] / 1e6
    row["down_mm_tflops"] = pairs * H * I * 2 / row["down_mm_us"] / 1e6
    for path in ("triton", "grouped"):
        row[f"{path}_layer_us"] = row["routing_us"] + row[f"{path}_us"]
        row[f"{path}_share_of_bound"] = row["bound_us"] / row[f"{path}_layer_us"]
        row[f"{path}_share_of_mm_peak"] = flop_us / row[f"{path}_layer_us"]
    # equality: both against the fp32 reference; the grouped path's replay against its eager call
    w0, ids0 = routed[0]
    c = min(n, CHECK_TOKENS)
    args = (x[:c], layers.gate_up[0], layers.down[0], w0[:c], ids0[:c])
    ref = experts_ref(x[:c].float(), layers.gate_up[0].float(), layers.down[0].float(), w0[:c], ids0[:c].long())
    row["triton_max_abs_err"] = float((fused_experts(*args).float() - ref).abs().max())
    row["grouped_max_abs_err"] = float((grouped_mm_experts(*args).float() - ref).abs().max())
    row["ref_max_abs"] = float(ref.abs().max())
    eager = grouped_mm_experts(x, layers.gate_up[0], layers.down[0], *routed[0])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = grouped_mm_experts(x, layers.gate_up[0], layers.down[0], *routed[0])
    graph.replay()
    torch.cuda.synchronize()
    row["grouped_replay_equals_eager"] = bool(torch.equal(out, eager))
    del graph
    row["triton_peak_bytes"] = peak_bytes(lambda: fused_experts(x, layers.gate_up[0], layers.down[0], *routed[0], config))
    row["grouped_peak_bytes"] = peak_bytes(lambda: grouped_mm_experts(x, layers.gate_up[0], layers.down[0], *routed[0]))
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the tail variants' layers (median kept)")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS,
                        help=f"the layer's launch variants to time, of {','.join(TAIL_VARIANTS)}")
    args = parser.parse_args()
    variants = tuple(args.variants.split(","))
    if unknown := set(variants) - set(TAIL_VARIANTS):
        parser.error(f"--variants: no variant {sorted(unknown)}; known: {','.join(TAIL_VARIANTS)}")
    copy_bs, peak = copy_bandwidth(), mm_flops()
    result: dict = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                    "torch": torch.__version__, "copy_bytes_s": copy_bs, "mm_flops": peak,
                    "layers": LAYERS, "moe": {}}
    log(f"{result['device']} torch {torch.__version__}: copy {copy_bs / 1e9:.0f} GB/s, "
        f"bf16 mm {peak / 1e12:.0f} TFLOP/s")
    for name in MOE:
        layers = MoeLayers(name)
        result["moe"][name] = []
        for n in map(int, args.tokens.split(",")):
            row = case(layers, n, copy_bs, peak, args.rounds, variants)
            result["moe"][name].append(row)
            log(f"{name} n={n}: triton {row['triton_layer_us']:.1f} us ({100 * row['triton_share_of_bound']:.0f}% "
                f"of bound, {100 * row['triton_share_of_mm_peak']:.0f}% of mm), grouped {row['grouped_layer_us']:.1f} us "
                f"({100 * row['grouped_share_of_bound']:.0f}%, {100 * row['grouped_share_of_mm_peak']:.0f}%), "
                + "".join(f"{v} tails {row[f'grouped_{v}_layer_us']:.1f} us "
                          f"({100 * row['bound_us'] / row[f'grouped_{v}_layer_us']:.0f}%, "
                          f"same bits {row[f'grouped_{v}_equals_default']}), " for v in variants)
                + "; "
                f"parts: sort {row['sort_us']:.1f} (torch.sort {row['torch_sort_us']:.1f}, argsort {row['argsort_us']:.1f}) gather {row['gather_us']:.1f} "
                f"(index_select {row['index_select_us']:.1f}) up {row['up_mm_us']:.1f} "
                f"({row['up_mm_tflops']:.0f} TF/s) down {row['down_mm_us']:.1f} ({row['down_mm_tflops']:.0f} TF/s) "
                f"silu {row['silu_us']:.1f} sum {row['sum_us']:.1f}; tma gated {row['tma_gated_us']:.1f} "
                f"({row['tma_gated_tflops']:.0f} TF/s) tma down {row['tma_down_us']:.1f} "
                f"({row['tma_down_tflops']:.0f} TF/s); "
                f"err triton {row['triton_max_abs_err']:.3g} grouped {row['grouped_max_abs_err']:.3g}; "
                f"replay==eager {row['grouped_replay_equals_eager']}; peak MB triton "
                f"{row['triton_peak_bytes'] / 2**20:.0f} grouped {row['grouped_peak_bytes'] / 2**20:.0f}")
            save_results(result, args.out)
        del layers
        torch.cuda.empty_cache()
    log("done")


if __name__ == "__main__":
    main()
