"""Issue 33: the MoE extend GEMMs on cgtool's persistent TMA grouped GEMM (`moe_tma_gemm`)
against torch's grouped GEMM, on the same sorted rows.

For qwen3-30b-a3b's and deepseek-v2-lite's shapes at 2k-16k tokens, each a replayed CUDA graph
over bench_moe_mla's six layers of distinct weights, per layer:
  - gate/up: torch's grouped GEMM then `silu_mul_weight`, against the gated TMA kernel (both
    write the activations);
  - down: torch's grouped GEMM against the plain TMA kernel;
every launch setting in SWEEP, with the max |diff| of each against torch's result (bits where
equal).

    python3 benchmarks/bench_moe_tma.py --out tma.json
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import triton
import triton.compiler.errors
import triton.runtime.errors
from bench_moe_mla import (  # benchmarks/ is the script's path
    LAYERS,
    MOE,
    MoeLayers,
    graph_us,
    log,
    mm_flops,
    save_results,
)

from cgtool.model import moe_grouped
from cgtool.model.moe_grouped import (
    _GROUPED_MM,
    gather_rows,
    silu_mul_weight,
    sort_pairs,
)
from cgtool.model.moe_tma_gemm import launch_tiles, tma_grouped_mm

TOKENS = (2048, 4096, 8192, 16384)
# (block_m, block_n, num_warps, num_stages, flatten). Call 1 (H200) swept 128-row blocks at
# 64-256 columns, 4-8 warps, 3-4 stages, flattened or not: 128 x 128 at 8 warps and 3 stages won
# the gated GEMM at every size, 128 x 256 at 8 warps, 3 stages, flattened the down GEMM. Call 3
# (H100) added 64-row blocks at 4 warps, 64-256 columns, 3-5 stages: none won anywhere.
# The last two fields, tails: an expert's last rows, if at most 64, in a 64-row tile of their
# own; and those of at most 32 rows in a transposed 32-wide tile instead (narrow).
TAIL_KINDS = [(False, False), (True, False), (True, True)]
# The last field: whole blocks' K loops warp-specialized by Triton (`tl.range(warp_specialize=)`).
SWEEP_GATED = [(128, 128, 8, 3, False, False, False), (128, 128, 8, 4, False, False, False)]
SWEEP_GATHERING = [(128, 128, 8, stages, False, *tail) for tail in TAIL_KINDS for stages in (3, 4)]
SWEEP_PLAIN = [(128, 256, 8, stages, True, *tail) for tail in TAIL_KINDS for stages in (3, 4)]
SWEEP_WS_GATHERING = [(128, 128, 8, stages, False, False, False, True) for stages in (3, 4)]
# The gathering form with its whole tiles' loop flattened (the next tile's loads issued before
# this one's epilogue), which call 1 swept on sorted rows only (`--flatten-gathering`): 13-58%
# slower at 2k-8k tokens (H200, benchmarks/results/h200-2026-11-27-moe-tiles, call 1).
SWEEP_FLAT_GATHERING = [(128, 128, 8, stages, True, *tail) for tail in ((False, False), (True, True))
                        for stages in (3, 4)]
# The tiles' order (`--orders`): block-major and expert-major (an expert's row blocks of one
# column side by side, so programs running at once share the weights' tile in L2). A tenth
# field 0 points every expert at expert 0's weights, whose 6-9 MB L2 keeps: the time with the
# experts' weights never read from HBM again, a bound (its output is not the reference's).
SWEEP_ORDER_GATHERING = [(128, 128, 8, stages, False, tail, narrow, False, order)
                         for order in (0, 1) for stages, tail, narrow in ((4, True, True), (3, False, False),
                                                                          (4, False, False), (4, True, False),
                                                                          (3, True, True))]
# (Tails beside their expert's blocks in one loop, `tile_order=2` until c3de13b: 4-11% slower.)
SWEEP_ORDER_GATHERING += [(128, 128, 8, 4, False, True, True, False, 1, 0),
                          (128, 128, 8, 3, False, False, False, False, 1, 0)]
# A program a tile (`--orders`, last field): tiles that start together stay side by side,
# where persistent programs drift apart; the launch fills SMs as programs end.
ONE_PROGRAM_A_TILE = 1 << 24
SWEEP_ORDER_GATHERING += [(128, 128, 8, 4, False, False, False, False, order, None, ONE_PROGRAM_A_TILE)
                          for order in (0, 1)]
# 256-row tiles 64 columns wide (`--tall-tiles`, with `--orders`): the same accumulator registers
# as 128 x 128, an expert's weights' tile read once for 256 rows (at 4k tokens an expert's rows).
SWEEP_TALL = [(256, 64, 8, stages, False, tail, tail, False, 1) for stages in (3, 4) for tail in (False, True)]
SWEEP_TALL += [(128, 128, 8, 4, False, False, False, False, 1), (128, 128, 8, 4, False, True, True, False, 0),
               (256, 64, 8, 4, False, False, False, False, 1, 0)]
SWEEP_ORDER_PLAIN = ([(128, 256, 8, stages, True, False, False, False, order) for stages in (3, 4) for order in (0, 1)]
                     + [(128, 256, 8, 3, True, False, False, False, 0, 0),
                        (128, 256, 8, 3, False, False, False, False, 0, None, ONE_PROGRAM_A_TILE)])
# The gate's and the up's weights in one box and one product (`joint_gate_up`, the last field); until
# 2b652db also an expert's last rows riding on its last whole block (slower).
SWEEP_ORDER_GATHERING += [(128, 128, 8, stages, False, False, False, False, order, None, None, True)
                          for stages in (4, 3) for order in (1, 0)]
# K steps of 128 (`--block-k`, the last field) at 2 stages, the most that fit, against the shipped
# 64 at 4 (gate/up) and 3 (down) stages.
SWEEP_BK_GATHERING = [(128, 128, 8, stages, False, False, False, False, 1, None, None, True, bk)
                      for stages, bk in ((4, 64), (3, 64), (2, 128))]
SWEEP_BK_PLAIN = [(128, 256, 8, stages, flat, False, False, False, 0, None, None, False, bk)
                  for stages, flat, bk in ((3, True, 64), (2, True, 128), (2, False, 128))]
SWEEP_WS_PLAIN = [(128, 256, 8, stages, flat, False, False, True) for stages in (3, 4) for flat in (True, False)]


def setting(block_m: int, block_n: int, warps: int, stages: int, flatten: bool, tail: bool, narrow: bool,
            ws: bool = False, tile_order: int = 0, b_rows_per_expert: int | None = None,
            num_programs: int | None = None, joint: bool = False, block_k: int = 64) -> dict:
    opts = {"block_m": block_m, "block_n": block_n, "num_warps": warps, "num_stages": stages, "flatten": flatten,
            "tail": tail, "narrow_tail": narrow, "warp_specialize": ws, "tile_order": tile_order, "joint_gate_up": joint,
            "block_k": block_k}
    if num_programs is not None:
        opts["num_programs"] = num_programs
    return opts if b_rows_per_expert is None else {**opts, "b_rows_per_expert": b_rows_per_expert}


def checked(fn, reference: torch.Tensor) -> dict:
    try:
        out = fn()
    except (triton.runtime.errors.OutOfResources, triton.compiler.errors.CompilationError, RuntimeError) as err:
        # a setting that does not fit (shared memory, registers) or that this Triton cannot build
        return {"error": f"{type(err).__name__}: {str(err)[:120]}"}
    return {"max_abs_diff": float((out.float() - reference.float()).abs().max()),
            "equal": bool(torch.equal(out, reference))}


def swept(configs: list[tuple], run, reference: torch.Tensor, flops: float, rounds: int = 1) -> list[dict]:
    """Each launch setting's result against `reference` (layer 0) and its time over the layers,
    the median of `rounds` rounds, each round timing every setting in turn (`rounds_us`);
    `run(layer_ids, opts)` returns the layers' outputs."""
    settings = [setting(*config) for config in configs]
    out = [{**opts, **checked(lambda opts=opts: run([0], opts)[0], reference), "rounds_us": []} for opts in settings]
    for _ in range(rounds):
        for opts, res in zip(settings, out):
            if "error" not in res:
                res["rounds_us"].append(graph_us(lambda opts=opts: run(range(LAYERS), opts)) / LAYERS)
    for res in out:
        if "error" not in res:
            res["us"] = statistics.median(res["rounds_us"])
            res["tflops"] = flops / res["us"] / 1e6
    return out


def case(layers: MoeLayers, n: int, peak: float, gathering_only: bool = False, flatten: bool = False,
         rounds: int = 1, orders: bool = False, tall: bool = False, block_k: bool = False) -> dict:
    x, _, routed = layers.batch(n)
    E, k, H, I = layers.E, layers.k, layers.H, layers.I
    pairs = n * k
    sorts = [sort_pairs(ids, E) for _, ids in routed]
    rows = [gather_rows(x, s[0], k) for s in sorts]
    flat_w = [w.float().reshape(-1).contiguous() for w, _ in routed]
    up_ref = silu_mul_weight(_GROUPED_MM(rows[0], layers.gate_up[0].transpose(1, 2), offs=sorts[0][2]),
                             flat_w[0], sorts[0][0])
    acts = [silu_mul_weight(_GROUPED_MM(rows[i], layers.gate_up[i].transpose(1, 2), offs=sorts[i][2]),
                            flat_w[i], sorts[i][0]) for i in range(LAYERS)]
    down_ref = _GROUPED_MM(acts[0], layers.down[0].transpose(1, 2), offs=sorts[0][2])
    up_flops, down_flops = pairs * 2 * H * I * 2, pairs * H * I * 2
    row: dict = {"tokens": n, "pairs": pairs, "up_flops": up_flops, "down_flops": down_flops}
    row["torch_up_silu_us"] = graph_us(lambda: [silu_mul_weight(
        _GROUPED_MM(rows[i], layers.gate_up[i].transpose(1, 2), offs=sorts[i][2]), flat_w[i], sorts[i][0])
        for i in range(LAYERS)]) / LAYERS
    row["torch_down_us"] = graph_us(lambda: [_GROUPED_MM(acts[i], layers.down[i].transpose(1, 2),
                                                         offs=sorts[i][2]) for i in range(LAYERS)]) / LAYERS
    row["sort_us_by_chunk"] = {}
    default = moe_grouped._CHUNK
    for chunk in () if gathering_only or orders else (256, 512, 1024, 2048):
        moe_grouped._CHUNK = chunk
        row["sort_us_by_chunk"][chunk] = graph_us(lambda: [sort_pairs(ids, E) for _, ids in routed]) / LAYERS
        assert all(torch.equal(a, b) for a, b in zip(sort_pairs(routed[0][1], E), sorts[0]))
    moe_grouped._CHUNK = default
    # the gate/up GEMM reading its rows from the tokens, against the gather then the GEMM
    gated_tiles = {**launch_tiles(x.device.index, pairs / E)[0], "joint_gate_up": False}  # only gathering
    row["gather_then_gated_us"] = graph_us(lambda: [tma_grouped_mm(
        gather_rows(x, sorts[i][0], k), layers.gate_up[i], sorts[i][2], gated=True, pair_weights=flat_w[i],
        order=sorts[i][0], **gated_tiles) for i in range(LAYERS)]) / LAYERS
    sweep = SWEEP_GATHERING + (SWEEP_FLAT_GATHERING if flatten else []) + ([] if gathering_only else SWEEP_WS_GATHERING)
    if orders:
        sweep = SWEEP_BK_GATHERING if block_k else SWEEP_TALL if tall else SWEEP_ORDER_GATHERING
    row["gathering_gated"] = swept(sweep, lambda ids, opts: [tma_grouped_mm(
        x, layers.gate_up[j], sorts[j][2], gated=True, pair_weights=flat_w[j], order=sorts[j][0], gather_top_k=k,
        **opts) for j in ids], up_ref, up_flops, rounds)
    row["gated"] = [] if gathering_only or orders else swept(SWEEP_GATED, lambda ids, opts: [tma_grouped_mm(
        rows[j], layers.gate_up[j], sorts[j][2], gated=True, pair_weights=flat_w[j], order=sorts[j][0], **opts)
        for j in ids], up_ref, up_flops)
    row["down"] = [] if gathering_only else swept((SWEEP_BK_PLAIN if block_k else SWEEP_ORDER_PLAIN) if orders else SWEEP_PLAIN + SWEEP_WS_PLAIN,
                                                  lambda ids, opts: [tma_grouped_mm(
        acts[j], layers.down[j], sorts[j][2], **opts) for j in ids], down_ref, down_flops, rounds if orders else 1)
    best_g = min((r for r in row["gated"] if "us" in r), key=lambda r: r["us"], default=None)
    best_d = min((r for r in row["down"] if "us" in r), key=lambda r: r["us"], default=None)
    row["torch_up_tflops"] = up_flops / row["torch_up_silu_us"] / 1e6
    row["torch_down_tflops"] = down_flops / row["torch_down_us"] / 1e6
    row["best_gated"], row["best_down"] = best_g, best_d
    return row


def brief(settings: list[dict]) -> list[tuple]:
    return [(r["num_stages"], r["flatten"], r["tail"], r["narrow_tail"], r["warp_specialize"], r["tile_order"],
             r.get("b_rows_per_expert"), r.get("num_programs"), r["joint_gate_up"], r["block_k"], round(r.get("us", -1), 1), r.get("equal"))
            for r in settings]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    parser.add_argument("--flatten-gathering", action="store_true", help="add SWEEP_FLAT_GATHERING")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the gathering sweep (median kept)")
    parser.add_argument("--gathering-only", action="store_true",
                        help="time the gathering gate/up GEMM's settings alone (no sort chunks, down or sorted rows)")
    parser.add_argument("--orders", action="store_true",
                        help="time the tiles' orders (SWEEP_ORDER_*), `--rounds` rounds for both GEMMs")
    parser.add_argument("--tall-tiles", action="store_true", help="with --orders: SWEEP_TALL's gate/up settings")
    parser.add_argument("--block-k", action="store_true", help="with --orders: SWEEP_BK_* (K steps of 128)")
    args = parser.parse_args()
    peak = mm_flops()
    result: dict = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                    "torch": torch.__version__, "mm_flops": peak, "layers": LAYERS, "moe": {}}
    log(f"{result['device']} torch {torch.__version__}: bf16 mm {peak / 1e12:.0f} TFLOP/s")
    for name in MOE:
        layers = MoeLayers(name)
        result["moe"][name] = []
        for n in map(int, args.tokens.split(",")):
            row = case(layers, n, peak, args.gathering_only, args.flatten_gathering, args.rounds, args.orders, args.tall_tiles,
                       args.block_k)
            result["moe"][name].append(row)
            g, d = row["best_gated"] or {}, row["best_down"] or {}
            log(f"{name} n={n}: gate/up+silu torch {row['torch_up_silu_us']:.1f} us "
                f"({row['torch_up_tflops']:.0f} TF/s) tma {g.get('us', float('nan')):.1f} "
                f"({g.get('tflops', float('nan')):.0f}) {g}; down torch {row['torch_down_us']:.1f} "
                f"({row['torch_down_tflops']:.0f}) tma {d.get('us', float('nan')):.1f} "
                f"({d.get('tflops', float('nan')):.0f}) {d}")
            log(f"  sort us by chunk: {row['sort_us_by_chunk']}")
            log(f"  gather then gated {row['gather_then_gated_us']:.1f} us; gathering gated (stages, flatten, tail, "
                f"narrow, warp-specialized, order, b rows, programs, us, equal) {brief(row['gathering_gated'])}")
            log(f"  down {brief(row['down'])}")
            errors = {r.get("error") for r in row["gated"] + row["gathering_gated"] + row["down"] if "error" in r}
            if errors:
                log(f"  settings that failed: {sorted(errors)[:3]}")
            save_results(result, args.out)
        del layers
        torch.cuda.empty_cache()
    log("done")


if __name__ == "__main__":
    main()
