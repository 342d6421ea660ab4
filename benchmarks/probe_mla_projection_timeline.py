"""Issue 33: where MLA decode's time goes after stage 1, program by program, with the merge in the
value projection.

`probe_mla_projection.py` times a layer (the step's store, gluon_mla_wgmma's stage 1 unmerged,
`mla_merge_projection`'s kernel) as a whole. This replays the same graph of layers with both
kernels' program stamps on (`cgtool.runtime.kernel_trace`) and reports per case, the median
over the graph's layers, in microseconds:

- stage 1: its programs' ramp, their wait on the store, their loop, and the last loop's end;
- the projection, each time against stage 1's last loop end: its programs' starts, their
  return from the wait on stage 1, the merge, the product and store, its last program's end;
- the gap from a layer's last projection program to the next layer's first stage 1 program
  (the next store runs there).

The graph without stamps is timed beside it, so the stamps' own cost shows. --settings sets
constants as probe_mla_projection.py's does, each a variant of its own.

    python3 benchmarks/probe_mla_projection_timeline.py --out stamps.json [--cases 8x4096,16x2048]
        [--settings "st1:SLOT_STAGES=1"] [--layers 27]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch
from bench_moe_mla import LAYERS, MLA_HEADS, copy_bandwidth, graph_us, log, save_results
from probe_mla_projection import V, latent_read_us, mla_layer, parse_settings, set_to
from probe_mla_timeline import parse_case

from cgtool.attention import triton_mla
from cgtool.attention.mla_merge_projection import decode_projected, projection_programs
from cgtool.runtime import kv_store
from cgtool.runtime.kernel_trace import TRACE_SLOTS

CASES = "8x4096,16x2048,16x4096,32x1024,16x1024"
# Stage 1's stamps: SM, start, chunk known (after its wait), loop end. The projection's: SM,
# start, plan loaded, wait returned, merged, multiplied.
S1_START, S1_KNOWN, S1_LOOP = 1, 2, 3
P_START, P_PLAN, P_WAIT, P_MERGED, P_DONE = 1, 2, 3, 4, 5
# The Gluon kernel's merge over slots: its last step's partials in shared memory, its products done.
P_STEP_STORED, P_STEP_MMA = 6, 7


def spread_us(values: list[int]) -> dict[str, float]:
    """min / median / max of nanosecond intervals, in microseconds."""
    if not values:
        return {}
    return {"min": min(values) / 1e3, "median": statistics.median(values) / 1e3, "max": max(values) / 1e3}


def layer_summary(stage1: list[list[int]], projection: list[list[int]]) -> dict:
    """One layer's two launches, against stage 1's last loop end (`s1_end`)."""
    ran = [r for r in stage1 if r[S1_START] > 0]
    looped = [r for r in ran if r[S1_LOOP] > 0]
    first = min(r[S1_START] for r in ran)
    s1_end = max(r[S1_LOOP] for r in looped)
    return {
        "first_start_ns": first,
        "stage1_programs": len(ran), "stage1_looped": len(looped),
        "stage1_ramp": spread_us([r[S1_START] - first for r in ran]),
        "stage1_known": spread_us([r[S1_KNOWN] - first for r in looped]),
        "stage1_loop": spread_us([r[S1_LOOP] - r[S1_KNOWN] for r in looped]),
        "stage1_end": (s1_end - first) / 1e3,
        "projection_start": spread_us([r[P_START] - s1_end for r in projection]),
        "projection_plan": spread_us([r[P_PLAN] - r[P_START] for r in projection]),
        "projection_wait": spread_us([r[P_WAIT] - s1_end for r in projection]),
        "projection_merge": spread_us([r[P_MERGED] - r[P_WAIT] for r in projection]),
        "projection_product": spread_us([r[P_DONE] - r[P_MERGED] for r in projection]),
        # The merge over slots' one step, where a program took one (the Gluon kernel stamps it):
        # the wait's return to the partials in shared memory, their products, the rest.
        **({"projection_step_loaded": spread_us([r[P_STEP_STORED] - r[P_WAIT] for r in stepped]),
            "projection_step_mma": spread_us([r[P_STEP_MMA] - r[P_STEP_STORED] for r in stepped]),
            "projection_step_rest": spread_us([r[P_MERGED] - r[P_STEP_MMA] for r in stepped])}
           if (stepped := [r for r in projection if r[P_STEP_STORED] > 0]) else {}),
        "projection_end": (max(r[P_DONE] for r in projection) - s1_end) / 1e3,
        "projection_sms": len({r[0] for r in projection}),
        "last_done_ns": max(r[P_DONE] for r in projection),
    }


def median_of(layers: list[dict], key: str, part: str | None = None) -> float:
    values = [(layer[key][part] if part else layer[key]) for layer in layers if not part or layer[key]]
    return statistics.median(values) if values else 0.0


def timeline_case(lens: list[int], copy_bs: float, values: dict[str, int], layers: int) -> dict:
    bs = len(lens)
    t = mla_layer(lens, layers)
    stage1_rows = triton_mla.WGMMA_PROGRAMS + bs
    with set_to(values):
        projection_rows = projection_programs(bs, MLA_HEADS, V)
    s1_traces = torch.zeros(layers, stage1_rows, TRACE_SLOTS, dtype=torch.int64, device="cuda")
    p_traces = torch.zeros(layers, projection_rows, TRACE_SLOTS, dtype=torch.int64, device="cuda")

    def run(traced: bool) -> None:
        memo: dict = {}
        with set_to(values):
            for i, c in enumerate(t.caches):
                kv_store.store_kv(c, None, t.newest, t.new_rows, None)
                assert decode_projected(t.q, c, t.w_uv, t.o, t.r2t, t.rows, t.seq_lens, 0.07, memo=memo,
                                        trace=s1_traces[i] if traced else None,
                                        projection_trace=p_traces[i] if traced else None)

    run(False)
    plain = t.o.clone()
    run(True)
    equal = bool(torch.equal(t.o, plain))
    plain_us = graph_us(lambda: run(False)) / layers
    traced_us = graph_us(lambda: run(True)) / layers  # the last replay's stamps stay in the traces
    summaries = [layer_summary(s1_traces[i].tolist(), p_traces[i].tolist()) for i in range(layers)]
    gaps = [(summaries[i + 1]["first_start_ns"] - summaries[i]["last_done_ns"]) / 1e3 for i in range(layers - 1)]
    keys = ("stage1_ramp", "stage1_known", "stage1_loop", "projection_start", "projection_plan", "projection_wait",
            "projection_merge", "projection_product")
    if "projection_step_loaded" in summaries[0]:
        keys += ("projection_step_loaded", "projection_step_mma", "projection_step_rest")
    medians = {f"{k}_{part}": median_of(summaries, k, part) for k in keys for part in ("median", "max")}
    medians |= {k: median_of(summaries, k) for k in ("stage1_end", "projection_end", "projection_sms")}
    return {
        "bs": bs, "context": max(lens), "lens": lens if len(set(lens)) > 1 else None, "settings": values,
        "bound_us": latent_read_us(lens, copy_bs), "us": plain_us, "traced_us": traced_us,
        "traced_output_equal": equal, "next_layer_gap_us": statistics.median(gaps), "medians": medians,
        "layers_summary": summaries,
    }


def summary_line(row: dict) -> str:
    """One case's medians as the log states them: the layer, stage 1, then the projection."""
    m = row["medians"]
    line = (
        f"{row['us']:.1f} us a layer ({row['traced_us']:.1f} traced, output "
        f"{'equal' if row['traced_output_equal'] else 'DIFFERS'}), bound {row['bound_us']:.1f}; stage 1 "
        f"ramp {m['stage1_ramp_max']:.2f}, known {m['stage1_known_median']:.2f}, loop "
        f"{m['stage1_loop_median']:.2f} (max {m['stage1_loop_max']:.2f}), end {m['stage1_end']:.2f}; after it "
        f"the projection starts {m['projection_start_median']:.2f} (max {m['projection_start_max']:.2f}), "
        f"plan {m['projection_plan_median']:.2f}, wait returns {m['projection_wait_median']:.2f} "
        f"(max {m['projection_wait_max']:.2f}), merge {m['projection_merge_median']:.2f} "
        f"(max {m['projection_merge_max']:.2f}), product {m['projection_product_median']:.2f} "
        f"(max {m['projection_product_max']:.2f}), ends {m['projection_end']:.2f} on "
        f"{m['projection_sms']:.0f} SMs; to the next stage 1 {row['next_layer_gap_us']:.2f}"
    )
    if "projection_step_loaded_median" in m:
        line += (f"; its merge's last step: partials in shared memory {m['projection_step_loaded_median']:.2f}, "
                 f"products {m['projection_step_mma_median']:.2f}, the rest {m['projection_step_rest_median']:.2f}")
    return line


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", default=CASES, help="BSxCONTEXT,... or mixes such as 40x300+1x16000")
    parser.add_argument("--settings", default="", help="more variants: NAME:CONST=V[,CONST=V];...")
    parser.add_argument("--layers", type=int, default=LAYERS, help="layers a graph (deepseek-v2-lite has 27)")
    args = parser.parse_args()
    variants = {"shipped": {}, **{name.removeprefix("fused_"): v for name, v in parse_settings(args.settings).items()}}
    copy_bs = copy_bandwidth()
    result: dict = {"device": torch.cuda.get_device_name(), "copy_bytes_s": copy_bs, "layers": args.layers, "cases": []}
    log(f"{result['device']}: copy {copy_bs / 1e9:.0f} GB/s")
    for case in args.cases.split(","):
        for name, values in variants.items():
            row = timeline_case(parse_case(case), copy_bs, values, args.layers)
            row["variant"] = name
            result["cases"].append(row)
            save_results(result, args.out)
            log(f"{case} {name}: {summary_line(row)}")
            torch.cuda.empty_cache()
    log("done")


if __name__ == "__main__":
    sys.exit(main())
