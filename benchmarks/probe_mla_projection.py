"""Issue 33: MLA decode's merge moved into the value projection, timed against the two apart.

gluon_mla_wgmma's last program a request merged the chunks after a ticket (bs 17-132); the
value projection then ran as torch's batched product. `mla_merge_projection.decode_projected`
leaves the chunks unmerged and merges them as its own product loads them. Each case times, in
graphs of LAYERS layers (--layers) over distinct latent pools, alternating rounds:

- apart: mla_decode_attention (merged in the last program) then mla.value_projection;
- unmerged: decode_projected's stage 1 alone (and unmerged_NAME under a setting of stage 1);
- fused: decode_projected;
- product: value_projection alone, the projection's own cost;
- attention: mla_decode_attention alone, what the kernel targets timed so far.

The attention's share of its latent read is given both ways: `attention` alone, and `fused`
less `product` (the merge charged to the attention, the projection's own time not).

    python3 benchmarks/probe_mla_projection.py --out projection.json [--cases 32x1024,24x1024]
        [--rounds 3] [--settings "m32:BLOCK_M=32;g8:MERGE_GROUP=8;qf:wg.Q_FIRST=1"]

A setting's constant is mla_merge_projection's, with "wg." gluon_mla_wgmma's (stage 1's), with "tm." triton_mla's.
Each fused run is one forward: its layers share one flat plan (mla_flat_plan), planned by the
first. With --before DIR, `before` times decode_projected of an earlier build's
gluon_mla_wgmma.py and mla_merge_projection.py kept in DIR, in the same rounds (its layers sharing
one plan where that build takes `memo`), and its bits are compared with this build's.
With --with-store each layer's fused, unmerged and settings' runs first store the batch's newest
rows (kv_store, which releases stage 1 at its start, as in a model's step), and `store` times
the stores alone; shares then take the store's time out as they take the product's.

Each layer multiplies by an up-projection of its own, as a model's layers do (since 2026-11-28):
then the product alone reads its weights from HBM, as a separate product would in the model, and
takes 3.8 us a layer on the H100 where it took 3.0 with one up-projection for all 27 layers, which
L2 kept (--shared-weights, every figure before; benchmarks/results/h100-2026-11-28-mla-key-step).

BENCH_GRAPH_STATE=fast or slow puts the process in that graph state after each capture
(bench_moe_mla.set_graph_state); the figures did not move with it (H200, 2026-11-28,
benchmarks/results/h200-2026-11-28-mla-stage1-parts).
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import statistics
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from bench_moe_mla import (
    DTYPE,
    GRAPH_STATE,
    LAYERS,
    MLA_HEADS,
    RANK,
    ROPE,
    copy_bandwidth,
    graph_us,
    latent_setup,
    log,
    save_results,
)
from probe_mla_timeline import overridden, parse_case

import cgtool.attention
from cgtool.attention import gluon_mla_wgmma, mla_merge_projection, triton_mla
from cgtool.attention.mla_merge_projection import decode_projected, serves
from cgtool.attention.triton_mla import mla_decode_attention, mla_num_kv_splits
from cgtool.model.mla import value_projection
from cgtool.runtime import kv_store

CASES = "17x1024,24x1024,32x1024,40x1024,48x1024,64x1024,16x2048+1x1024,32x8192,40x300+1x16000"
V = 128  # deepseek-v2-lite's v_head_dim
Setting = int | tuple[int, ...]  # a constant's value in --settings


def earlier_build(folder: Path):
    """decode_projected of the gluon_mla_wgmma.py and mla_merge_projection.py in `folder`, loaded
    as modules of their own beside this build's (the projection's import of the stage 1 module
    names the earlier one)."""
    def load(name: str):
        spec = importlib.util.spec_from_file_location(f"earlier_{name}", folder / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    stage1 = load("gluon_mla_wgmma")
    with overridden(cgtool.attention, {"gluon_mla_wgmma": stage1}):
        return load("mla_merge_projection").decode_projected


def parse_settings(text: str) -> dict[str, dict[str, Setting]]:
    """"m32:BLOCK_M=32;g8:MERGE_GROUP=8" -> {"fused_m32": {"BLOCK_M": 32}, ...}: more fused
    variants, with mla_merge_projection's constants set so. A value of integers joined by "/"
    sets a tuple constant ("wg.WGMMA_TILES=64/1/4")."""
    found = {}
    for item in filter(None, text.split(";")):
        name, values = item.split(":")
        found[f"fused_{name}"] = {k: setting_value(v) for k, v in (pair.split("=") for pair in values.split(","))}
    return found


def setting_value(text: str) -> Setting:
    """"8" -> 8, "64/1/4" -> (64, 1, 4)."""
    return tuple(int(part) for part in text.split("/")) if "/" in text else int(text)


@contextmanager
def set_to(values: dict[str, Setting]):
    """A setting's constants set for the calls inside: "wg.NAME" gluon_mla_wgmma's, "tm.NAME"
    triton_mla's (WGMMA_PROGRAMS: the programs the step's plan shares the chunks among), others
    mla_merge_projection's."""
    stage1 = {k.removeprefix("wg."): v for k, v in values.items() if k.startswith("wg.")}
    chunks = {k.removeprefix("tm."): v for k, v in values.items() if k.startswith("tm.")}
    projection = {k: v for k, v in values.items() if not k.startswith(("wg.", "tm."))}
    with overridden(mla_merge_projection, projection), overridden(gluon_mla_wgmma, stage1), \
            overridden(triton_mla, chunks):
        yield


@dataclass
class MlaLayer:
    """One MLA decode layer's tensors (deepseek-v2-lite's heads) over `layers` latent pools."""

    caches: list[torch.Tensor]
    r2t: torch.Tensor
    rows: torch.Tensor
    newest: torch.Tensor  # each request's newest key's slot: the step's store writes its row
    new_rows: torch.Tensor
    seq_lens: torch.Tensor
    q: torch.Tensor
    w_uvs: list[torch.Tensor]  # each layer's up-projection: one for all, or one each (distinct)
    latent_out: torch.Tensor
    o: torch.Tensor
    splits: int

    @property
    def w_uv(self) -> torch.Tensor:
        """The first layer's up-projection (every layer's, shared)."""
        return self.w_uvs[0]


def alternating_rounds(runs: dict, rounds: int, layers: int) -> dict[str, list[float]]:
    """us a layer of each run, a graph of `layers` layers timed once a round, the runs in turn."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            times[name].append(graph_us(run) / layers)
    return times


def latent_read_us(lens: list[int], copy_bs: float) -> float:
    """The batch's latent rows read at the copy bandwidth: the shares' bound."""
    return sum(lens) * (RANK + ROPE) * DTYPE.itemsize / copy_bs * 1e6


def up_projection() -> torch.Tensor:
    """A layer's w_uv [heads, v, rank]: kv_b_proj's rows for a head are 128 of the key's, then
    the value's 128."""
    return (torch.randn(MLA_HEADS, 2 * V, RANK, device="cuda") / RANK**0.5).to(DTYPE)[:, V:]


def mla_layer(lens: list[int], layers: int, distinct_weights: bool = False) -> MlaLayer:
    bs = len(lens)
    caches, r2t, rows = latent_setup(lens, layers)
    newest = r2t[rows.long(), torch.tensor(lens, device="cuda") - 1].long()
    first = up_projection()
    w_uvs = [first] + [up_projection() if distinct_weights else first for _ in range(layers - 1)]
    return MlaLayer(
        caches, r2t, rows, newest, torch.randn(bs, 1, RANK + ROPE, device="cuda").to(DTYPE),
        torch.tensor(lens, dtype=torch.int32, device="cuda"),
        torch.randn(bs, MLA_HEADS, RANK + ROPE, device="cuda").to(DTYPE), w_uvs,
        torch.empty(bs, MLA_HEADS, RANK, device="cuda", dtype=DTYPE),
        torch.empty(bs, MLA_HEADS * V, device="cuda", dtype=DTYPE), mla_num_kv_splits(bs, MLA_HEADS))


def time_case(lens: list[int], copy_bs: float, rounds: int, settings: dict[str, dict[str, int]],
              with_store: bool = False, before=None, layers: int = LAYERS,
              distinct_weights: bool = False) -> dict:
    bs = len(lens)
    t = mla_layer(lens, layers, distinct_weights)
    layer_weights = list(zip(t.caches, t.w_uvs, strict=True))
    caches, r2t, rows, seq_lens, q, w_uv, o = t.caches, t.r2t, t.rows, t.seq_lens, t.q, t.w_uv, t.o
    latent_out, splits = t.latent_out, t.splits

    def store(c) -> None:
        if with_store:
            kv_store.store_kv(c, None, t.newest, t.new_rows, None)
    assert serves(q, w_uv), f"bs {bs}: decode_projected does not serve here"

    def attention(cache) -> None:
        mla_decode_attention(q, cache, latent_out, r2t, rows, seq_lens, 0.07, splits, None)

    def product(w: torch.Tensor = w_uv) -> None:
        value_projection(latent_out.transpose(0, 1), w.transpose(1, 2), o)

    def fused(values: dict[str, int], projected=None):
        def run() -> None:
            memo: dict = {}
            with set_to(values):
                for c, w in layer_weights:
                    store(c)
                    if projected is None:
                        assert decode_projected(q, c, w, o, r2t, rows, seq_lens, 0.07, memo=memo)
                    elif "memo" in inspect.signature(projected).parameters:  # a build with the step's plan
                        assert projected(q, c, w, o, r2t, rows, seq_lens, 0.07, memo=memo)
                    else:
                        assert projected(q, c, w, o, r2t, rows, seq_lens, 0.07)
        return run

    def unmerged(values: dict[str, int]):
        def run() -> None:  # stage 1 alone, as decode_projected launches it
            memo: dict = {}
            with set_to(values), overridden(mla_merge_projection, {"merge_project": lambda *args: None}):
                for c, w in layer_weights:
                    store(c)
                    assert decode_projected(q, c, w, o, r2t, rows, seq_lens, 0.07, memo=memo)
        return run

    runs = {
        "apart": lambda: [(attention(c), product(w)) for c, w in layer_weights],
        "unmerged": unmerged({}),
        "fused": fused({}),
        "product": lambda: [product(w) for w in t.w_uvs],
        "attention": lambda: [attention(c) for c in caches],
        **({"store": lambda: [store(c) for c in caches]} if with_store else {}),
        **{name: fused(values) for name, values in settings.items()},
        # A setting of stage 1: stage 1 alone under it too.
        **{name.replace("fused_", "unmerged_"): unmerged(values) for name, values in settings.items()
           if any(k.startswith("wg.") for k in values)},
        **({"before": fused({}, before)} if before else {}),
    }
    for c in caches:  # the newest rows as every run leaves them
        store(c)
    attention(caches[0])
    product()
    apart = o.clone()
    decode_projected(q, caches[0], w_uv, o, r2t, rows, seq_lens, 0.07)
    diff = (o.float() - apart.float()).abs().max().item()
    shipped = o.clone()
    equal_bits, apart_diffs = {}, {}
    for name, values in settings.items():  # each setting's output against the shipped kernels'
        with set_to(values):
            decode_projected(q, caches[0], w_uv, o, r2t, rows, seq_lens, 0.07)
        equal_bits[name] = bool(torch.equal(o, shipped))
        apart_diffs[name] = (o.float() - apart.float()).abs().max().item()
    if before:
        assert before(q, caches[0], w_uv, o, r2t, rows, seq_lens, 0.07)
        equal_bits["before"] = bool(torch.equal(o, shipped))
    times = alternating_rounds(runs, rounds, layers)
    us = {name: statistics.mean(values) for name, values in times.items()}
    bound = latent_read_us(lens, copy_bs)
    less = us["product"] + us.get("store", 0.0)
    return {
        "bs": bs, "lens": lens if len(set(lens)) > 1 else None, "context": max(lens), "bound_us": bound,
        "us": us, "rounds_us": times, "max_abs_diff_fused_vs_apart": diff, "settings_equal_bits": equal_bits,
        "settings_max_abs_diff_vs_apart": apart_diffs,
        "share_attention_alone": bound / us["attention"], "distinct_weights": distinct_weights,
        "share_fused_less_product": bound / (us["fused"] - less), "with_store": with_store,
        **{f"share_{name}_less_product": bound / (us[name] - less) for name in [*settings, *us.keys() & {"before"}]},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", default=CASES, help="BSxCONTEXT,... or mixes such as 40x300+1x16000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settings", default="", help="more fused variants: NAME:CONST=V[,CONST=V];...")
    parser.add_argument("--with-store", action="store_true", help="each layer's newest rows stored first")
    parser.add_argument("--layers", type=int, default=LAYERS, help="layers a graph (deepseek-v2-lite has 27)")
    parser.add_argument("--before", type=Path, help="a folder holding an earlier build's two modules")
    parser.add_argument("--min-bs", type=int, help="mla_merge_projection.MIN_BS for every run (fewer requests)")
    parser.add_argument("--shared-weights", action="store_true",
                        help="one up-projection for every layer, which L2 keeps (before 2026-11-28); else one a layer")
    args = parser.parse_args()
    if args.min_bs is not None:
        mla_merge_projection.MIN_BS = args.min_bs
    settings = parse_settings(args.settings)
    before = earlier_build(args.before) if args.before else None
    copy_bs = copy_bandwidth()
    result: dict = {"device": torch.cuda.get_device_name(), "copy_bytes_s": copy_bs, "layers": args.layers,
                    "graph_state": GRAPH_STATE, "cases": []}
    log(f"{result['device']}: copy {copy_bs / 1e9:.0f} GB/s")
    for case in args.cases.split(","):
        row = time_case(parse_case(case), copy_bs, args.rounds, settings, args.with_store, before, args.layers,
                        distinct_weights=not args.shared_weights)
        result["cases"].append(row)
        save_results(result, args.out)
        us = row["us"]
        log(f"{case}: apart {us['apart']:.1f} us a layer, fused {us['fused']:.1f}, product {us['product']:.1f}, "
            f"attention {us['attention']:.1f}; bound {row['bound_us']:.1f}; share {row['share_attention_alone']:.0%} "
            f"alone, {row['share_fused_less_product']:.0%} fused less product; |fused - apart| "
            f"{row['max_abs_diff_fused_vs_apart']:.3g}; stage 1 unmerged {us['unmerged']:.1f}"
            + (f"; store {us['store']:.1f}" if args.with_store else "")
            + "".join(f"; {name} {us[name]:.1f} ({row[f'share_{name}_less_product']:.0%}, bits "
                      f"{'equal' if row['settings_equal_bits'][name] else 'DIFFER'}"
                      + (f", |- apart| {row['settings_max_abs_diff_vs_apart'][name]:.3g}"
                         if name in row["settings_max_abs_diff_vs_apart"] else "") + ")"
                      for name in [*settings, *us.keys() & {"before"}])
            + "".join(f"; {name} {us[name]:.1f}" for name in us if name.startswith("unmerged_")))
        torch.cuda.empty_cache()
    log("done")


if __name__ == "__main__":
    sys.exit(main())
