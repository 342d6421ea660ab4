"""Issue 33: MLA decode's dependent kernels released at the start of the kernel they follow.

A programmatic dependent launch is scheduled once every program of the kernel before it has
released it (or ended); it then waits for that kernel's end before reading its results. Released
at the start, its programs are placed while the kernel before still runs, wherever an SM has
room, and wait there. Two such pairs in MLA decode:

- bs 1-16: gluon_mla's stage 1, then its merge kernel past 8 chunks a request
  (gluon_mla.RELEASE_MERGE_AT_START, off as shipped: stage 1 does not release it, so it is
  launched at stage 1's end);
- bs 17-66: gluon_mla_wgmma's stage 1 unmerged, then the value projection that merges
  (gluon_mla_wgmma.RELEASE_AT_START; before, released after each program's loop).

Each case is a layer as a model's step runs it, in graphs of --layers layers over distinct
latent pools, one forward (one flat plan) a replay: the store of the batch's newest rows, the
attention and the value projection (merged in it where it serves, else torch's product after
it). `base` times the store and the product alone; shares are of the latent read at the copy
bandwidth over the layer less `base`. Settings set module constants for their runs, "gl.NAME=V"
gluon_mla's, "wg.NAME=V" gluon_mla_wgmma's and "tm.NAME=V" triton_mla's; rounds alternate.

    python3 benchmarks/probe_mla_release.py --out release.json [--cases 8x4096,16x2048]
        [--settings "wg_end:wg.RELEASE_AT_START=0;gl_start:gl.RELEASE_MERGE_AT_START=1"] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from contextlib import ExitStack

import torch
from bench_moe_mla import copy_bandwidth, log, save_results
from probe_mla_projection import alternating_rounds, latent_read_us, mla_layer
from probe_mla_timeline import overridden, parse_case

from cgtool.attention import gluon_mla, gluon_mla_wgmma, triton_mla
from cgtool.attention.mla_merge_projection import decode_projected
from cgtool.attention.triton_mla import mla_decode_attention
from cgtool.model.mla import value_projection
from cgtool.runtime import kv_store

CASES = "1x8192,8x1024,8x4096,16x1024,16x2048,17x1024,24x1024,32x1024,40x1024,48x1024"
MODULES = {"gl": gluon_mla, "wg": gluon_mla_wgmma, "tm": triton_mla}


def parse_settings(text: str) -> dict[str, dict[str, dict[str, int]]]:
    """"end:gl.A=0,wg.B=0" -> {"end": {"gl": {"A": 0}, "wg": {"B": 0}}}."""
    found: dict[str, dict[str, dict[str, int]]] = {}
    for item in filter(None, text.split(";")):
        name, values = item.split(":")
        found[name] = {}
        for pair in values.split(","):
            key, value = pair.split("=")
            module, constant = key.split(".")
            found[name].setdefault(module, {})[constant] = int(value)
    return found


def time_case(lens: list[int], copy_bs: float, rounds: int, layers: int,
              settings: dict[str, dict[str, dict[str, int]]]) -> dict:
    t = mla_layer(lens, layers)
    caches, rows, seq_lens, o = t.caches, t.rows, t.seq_lens, t.o

    def layer(cache, memo: dict) -> None:
        kv_store.store_kv(cache, None, t.newest, t.new_rows, None)
        if not decode_projected(t.q, cache, t.w_uv, o, t.r2t, rows, seq_lens, 0.07, memo=memo):
            mla_decode_attention(t.q, cache, t.latent_out, t.r2t, rows, seq_lens, 0.07, t.splits, None, memo=memo)
            value_projection(t.latent_out.transpose(0, 1), t.w_uv.transpose(1, 2), o)

    def forward(values: dict[str, dict[str, int]]):
        def run() -> None:
            memo: dict = {}
            with ExitStack() as stack:
                for module, constants in values.items():
                    stack.enter_context(overridden(MODULES[module], constants))
                for cache in caches:
                    layer(cache, memo)
        return run

    def base() -> None:
        for cache in caches:
            kv_store.store_kv(cache, None, t.newest, t.new_rows, None)
            value_projection(t.latent_out.transpose(0, 1), t.w_uv.transpose(1, 2), o)

    runs = {"shipped": forward({}), "base": base, **{name: forward(values) for name, values in settings.items()}}
    for cache in caches:
        kv_store.store_kv(cache, None, t.newest, t.new_rows, None)
    outputs = {}
    for name, run in runs.items():
        if name != "base":
            run()
            outputs[name] = o.clone()
    times = alternating_rounds(runs, rounds, layers)
    us = {name: statistics.mean(values) for name, values in times.items()}
    bound = latent_read_us(lens, copy_bs)
    return {
        "bs": len(lens), "lens": lens if len(set(lens)) > 1 else None, "context": max(lens), "bound_us": bound,
        "us": us, "rounds_us": times,
        "shares": {name: bound / (us[name] - us["base"]) for name in runs if name != "base"},
        "equal_bits": {name: bool(torch.equal(outputs[name], outputs["shipped"])) for name in settings},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", default=CASES, help="BSxCONTEXT,... or mixes such as 19x512+1x8192")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--layers", type=int, default=27, help="layers a graph (deepseek-v2-lite has 27)")
    parser.add_argument("--settings", default="wg_end:wg.RELEASE_AT_START=0;gl_start:gl.RELEASE_MERGE_AT_START=1",
                        help="NAME:MODULE.CONST=V[,...];...")
    args = parser.parse_args()
    settings = parse_settings(args.settings)
    copy_bs = copy_bandwidth()
    result: dict = {"device": torch.cuda.get_device_name(), "copy_bytes_s": copy_bs, "layers": args.layers,
                    "settings": settings, "cases": []}
    log(f"{result['device']}: copy {copy_bs / 1e9:.0f} GB/s")
    for case in args.cases.split(","):
        row = time_case(parse_case(case), copy_bs, args.rounds, args.layers, settings)
        result["cases"].append(row)
        save_results(result, args.out)
        us, shares = row["us"], row["shares"]
        log(f"{case}: base {us['base']:.1f} us a layer; bound {row['bound_us']:.1f}; "
            + "; ".join(f"{name} {us[name]:.1f} ({shares[name]:.0%}"
                        + ("" if name == "shipped" else f", bits {'equal' if row['equal_bits'][name] else 'DIFFER'}")
                        + ")" for name in shares))
        torch.cuda.empty_cache()
    log("done")


if __name__ == "__main__":
    sys.exit(main())
