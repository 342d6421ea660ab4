"""Issue 33: how fast can one launch read MLA decode's latent rows at all, beside the kernel.

The issue's MLA decode target is 60% of the latent read at the copy bandwidth. At short
contexts and small batches the kernel stays far below it, and neither its own changes nor
SGLang's kernel closed the gap. This measures what any kernel faces: the same bytes read by
kernels that do nothing else, each as a CUDA graph of LAYERS launches over distinct latent
pools (as bench_moe_mla times the attention):

- `torch_sum`: torch's own reduction over the pool's rows (an independent kernel);
- `flat`: a Triton kernel streaming the rows as one contiguous span, the best over a sweep of
  program counts and block sizes (no gather, no attention, no merge);
- `flat_dependent`: the same kernel launched as the previous one's programmatic dependent, as
  stage 1 is the store's: its launch overlaps that kernel's end, and it waits for it before
  reading. A layer's stage 1 pays no launch of its own, so this is the floor it faces;
- `mla`: the shipped `mla_decode_attention`, and `mla_bf16` with bf16 partial outputs;
- `mla_split_kernel` (`--splits`, `--mins`): the merge kernel's path at other chunk counts and
  least keys a chunk, its merge over 64 lanes and over the chunk count's power of two;
- `mla_fused` (`--fused`): the merge in the last program at other chunk counts, fp32 and bf16
  partials; `mla_warps` (`--warps`): at the shipped count, at other warps, fp32 and bf16;
- `merge_alone`: the merge kernel by itself, where the batch merges in a second launch;
- `mla_variants` (`--variants`, `;` between them): the kernel at other settings, each
  `chunks:keys,warps,stages:least keys:partials`, an empty field the shipped choice
  (`:32,8,3:192:` is the shipped chunk count at 32 keys a step, 8 warps, 3 stages, chunks of at
  least 192 keys, the shipped partials), each followed by the shipped kernel again;
  a fifth field, `:N`, runs stage 1 as gluon_mla's kernel with N tiles of rows (`::::2`; 0:
  triton_mla's kernel), a sixth the merge's columns at once (`:::::512`), a seventh the running
  sums of q . k in gluon_mla's stage 1 (`::::::1`), an eighth 1 or 0 for gluon_mla_wgmma's stage 1 or
  not (`:::::::1`; empty: `triton_mla.wgmma_serves`);
  `--skip-floor` leaves out the flat read and torch's sum when only the kernel's settings are
  compared.

Shares are of the latent read at the copy bandwidth (`bound_us`), as in docs/moe-mla.md.
BENCH_GRAPH_STATE=fast or slow sets the process's graph state after each capture
(bench_moe_mla.set_graph_state).

    python3 benchmarks/bench_mla_floor.py --out floor.json [--cases 32x1024,8x8192] [--dry]
        [--variants ':32,8,3:192:;5::192:bfloat16' --skip-floor]
"""

from __future__ import annotations

import argparse
import sys
import time

import bench_moe_mla as bench
import torch
import triton
import triton.language as tl

from cgtool.attention import gluon_mla, triton_mla
from cgtool.attention.triton_decode import decode_scratch
from cgtool.attention.triton_mla import mla_decode_attention, mla_num_kv_splits
from cgtool.runtime import dependent_launch as dependent_launch_module
from cgtool.runtime.dependent_launch import (
    dependent_launch,
    release_next_kernel,
    wait_for_previous_kernel,
)
from cgtool.runtime.kv_store import store_kv
from cgtool.runtime.triton_launch import cdiv

CASES = [(bs, 1024) for bs in (1, 8, 16, 24, 32, 48, 64, 96, 128, 256)] + [
    (bs, 8192) for bs in (1, 8, 16, 24, 32, 64)]
FLAT = [(programs, block, warps, stages) for programs in (132, 264, 528, 1056)
        for block, warps, stages in ((8192, 8, 2), (4096, 4, 3), (16384, 8, 2))]
SPLIT_TRIES = (8, 10, 12, 16, 24, 32, 64)


@triton.jit
def _read_flat(X, Out, n, per, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """Program p sums elements [p * per, (p + 1) * per) of X, BLOCK at a time. With PDL, launched
    as the previous launch's dependent: scheduled while it ends, reading after it."""
    wait_for_previous_kernel(PDL)
    release_next_kernel(PDL)
    p = tl.program_id(0)
    acc = tl.zeros((BLOCK,), tl.float32)
    for start in range(p * per, tl.minimum(p * per + per, n), BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(X + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(Out + p, tl.sum(acc, 0))


def same_sum(got: torch.Tensor, span: torch.Tensor) -> bool:
    """Whether a read kernel's partial sums add up to the span's: it read every byte once."""
    want = span.float().sum()
    return bool(torch.isclose(got.sum(), want, rtol=1e-3, atol=1e-2 * span.numel() ** 0.5))


def flat_us(caches: list[torch.Tensor], rows: int, dependent: bool = False) -> tuple[float, list[dict]]:
    """The best of FLAT's launch settings; `dependent`: each launch the previous one's dependent
    (where the GPU has dependent launches; `in_effect` is recorded)."""
    n = rows * caches[0].shape[-1]
    launch = dependent_launch(caches[0].device) if dependent else {"PDL": False}
    tried = []
    for programs, block, warps, stages in FLAT if bench.DEVICE == "cuda" else FLAT[:1]:
        per = cdiv(cdiv(n, programs), block) * block
        out = torch.empty(programs, device=bench.DEVICE, dtype=torch.float32)

        def read(out=out, programs=programs, per=per, block=block, warps=warps, stages=stages):
            for c in caches:
                _read_flat[(programs,)](c, out, n, per, BLOCK=block, num_warps=warps, num_stages=stages, **launch)

        us = bench.graph_us(read) / len(caches)
        tried.append({"programs": programs, "block": block, "warps": warps, "stages": stages, "us": us,
                      "read_all": same_sum(out, caches[-1]), "in_effect": bool(launch["PDL"])})
    return min(t["us"] for t in tried), tried


def merge_alone_us(bs: int, splits: int, seq_lens: torch.Tensor, partials: torch.dtype = torch.float32,
                   lanes: int = 64) -> float:
    """The merge kernel's launches alone, over partials already written."""
    rank, heads = bench.RANK, bench.MLA_HEADS
    mid_out, mid_lse = decode_scratch(bs, heads, rank, splits, torch.device(bench.DEVICE), None, partials)
    mid_out.normal_()
    mid_lse.normal_()
    out = torch.empty(bs, heads, rank, device=bench.DEVICE, dtype=bench.DTYPE)
    launch = dependent_launch(out.device)
    slice_d = triton_mla.MERGE_SLICE

    def run():
        for _ in range(bench.LAYERS):
            triton_mla._MLA_MERGE.launch(
                (bs, heads, cdiv(rank, slice_d)), mid_out, mid_lse, out, seq_lens,
                mid_out.stride(0), mid_out.stride(1), mid_out.stride(2), mid_lse.stride(0), mid_lse.stride(1),
                out.stride(0), out.stride(1), RANK=rank, BLOCK_D=slice_d, BLOCK_N=triton_mla.DECODE_TILES[0],
                NUM_SPLITS=splits, MIN_CHUNK=triton_mla.DECODE_TILES[0], LANES=lanes, **launch, num_warps=4, num_stages=1,
            )

    return bench.graph_us(run) / bench.LAYERS


def parse_variant(spec: str) -> dict:
    """`chunks:keys,warps,stages:least:partials` (empty fields: the shipped choice) as
    mla_decode_attention's arguments."""
    chunks, tiles, least, partials, buffers, merge, chains, wgmma = (spec.split(":") + [""] * 8)[:8]
    return {"spec": spec, "chunks": int(chunks) if chunks else None, "buffers": int(buffers) if buffers else None,
            "wgmma": bool(int(wgmma)) if wgmma else None,
            "merge_slice": int(merge) if merge else None, "chains": int(chains) if chains else None,
            "tiles": tuple(int(v) for v in tiles.split(",")) if tiles else None,
            "least": int(least) if least else None, "partials": getattr(torch, partials) if partials else None}


def after_store(bs: int, ctx: int, caches: list[torch.Tensor], r2t: torch.Tensor, pool_rows: torch.Tensor,
                seq_lens: torch.Tensor, q: torch.Tensor, out: torch.Tensor, layers: int,
                splits: int | None = None) -> dict:
    """MLA decode as a model layer runs it: after the step's store of each request's new row
    (its last key), as the attention op does. Layers of store and attention, less layers of
    the store alone, give the attention's part; with dependent launches (the store releases
    the attention at once, which waits for it) and without, then with them again (drift)."""
    splits = splits or mla_num_kv_splits(bs, bench.MLA_HEADS)
    new_rows = torch.randn(bs, 1, bench.RANK + bench.ROPE, device=bench.DEVICE).to(bench.DTYPE)
    loc = r2t[pool_rows.long(), ctx - 1].long()

    def store_only() -> list:
        return [store_kv(c, None, loc, new_rows, None) for c in caches]

    def store_then_mla() -> list:
        return [(store_kv(c, None, loc, new_rows, None),
                 mla_decode_attention(q, c, out, r2t, pool_rows, seq_lens, 0.07, splits))
                for c in caches]

    found = {}
    for name, on in (("", True), ("_plain", False), ("_again", True)):
        dependent_launch_module.DEPENDENT_LAUNCH = on
        try:
            store_us = bench.graph_us(store_only) / layers
            both_us = bench.graph_us(store_then_mla) / layers
        finally:
            dependent_launch_module.DEPENDENT_LAUNCH = True
        found |= {f"store{name}_us": store_us, f"store_mla{name}_us": both_us,
                  f"mla_after_store{name}_us": both_us - store_us}
    # The attention must see the stored rows, not what the slots held before: the last keys
    # are overwritten, then stored again and attended at once (as a layer does).
    first = caches[0]
    store_kv(first, None, loc, new_rows, None)
    mla_decode_attention(q, first, out, r2t, pool_rows, seq_lens, 0.07, splits)
    expected = out.clone()
    first[loc] = -new_rows
    store_kv(first, None, loc, new_rows, None)
    mla_decode_attention(q, first, out, r2t, pool_rows, seq_lens, 0.07, splits)
    found["max_diff_vs_no_store"] = (out.float() - expected.float()).abs().max().item()
    return found


def floor_case(bs: int, ctx: int, copy_bs: float, splits_tried: tuple[int, ...], mins: tuple[int, ...],
               fused_tried: tuple[int, ...], warps_tried: tuple[int, ...] = (), variants: tuple[dict, ...] = (),
               skip_floor: bool = False, with_store: bool = False, real: int | None = None) -> dict:
    """`real`: only the first `real` requests hold `ctx` keys, the rest one, as a graph's padding."""
    real = bs if real is None else real
    lens = [ctx] * real + [1] * (bs - real)
    layers = 2 if sum(lens) >= 64 * 8192 else bench.LAYERS
    caches, r2t, pool_rows = bench.latent_setup(lens, layers)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=bench.DEVICE)
    q = torch.randn(bs, bench.MLA_HEADS, bench.RANK + bench.ROPE, device=bench.DEVICE).to(bench.DTYPE)
    out = torch.empty(bs, bench.MLA_HEADS, bench.RANK, device=bench.DEVICE, dtype=bench.DTYPE)
    bound = sum(lens) * (bench.RANK + bench.ROPE) * bench.DTYPE.itemsize / copy_bs * 1e6
    splits = mla_num_kv_splits(bs, bench.MLA_HEADS)

    def mla(k: int, fused: bool | None = None, partials: torch.dtype | None = None, least: int | None = None,
            lanes: int | None = None, tiles: tuple[int, int, int] | None = None, buffers: int | None = None,
            merge_slice: int | None = None, chains: int | None = None, wgmma: bool | None = None) -> float:
        return bench.graph_us(lambda: [mla_decode_attention(
            q, c, out, r2t, pool_rows, seq_lens, 0.07, k, None, tiles, fused, partial_dtype=partials,
            min_chunk=least, merge_lanes=lanes, buffers=buffers, merge_slice=merge_slice,
            score_chains=chains, wgmma=wgmma) for c in caches]) / layers

    def max_diff(k: int, v: dict) -> float:
        """The variant's output against the shipped kernel's, on the first pool."""
        mla_decode_attention(q, caches[0], out, r2t, pool_rows, seq_lens, 0.07, splits)
        shipped = out.clone()
        mla_decode_attention(q, caches[0], out, r2t, pool_rows, seq_lens, 0.07, k, None, v["tiles"],
                             partial_dtype=v["partials"], min_chunk=v["least"], buffers=v["buffers"],
                             merge_slice=v["merge_slice"], score_chains=v["chains"], wgmma=v["wgmma"])
        return (out.float() - shipped.float()).abs().max().item()

    # The rows live from slot 1 on (latent_setup); torch's sum reads exactly them.
    spans = [c[1:1 + sum(lens)] for c in caches]
    row = {"bs": bs, "context": ctx, "real": real, "splits": splits, "bound_us": bound}
    if not skip_floor:
        row["torch_sum_us"] = bench.graph_us(lambda: [s.sum(dtype=torch.float32) for s in spans]) / layers
        row["flat_us"], row["flat_sweep"] = flat_us(spans, sum(lens))
        row["flat_dependent_us"], row["flat_dependent_sweep"] = flat_us(spans, sum(lens), dependent=True)
    row["mla_us"] = mla(splits)
    if with_store:
        row.update(after_store(bs, ctx, caches, r2t, pool_rows, seq_lens, q, out, layers))
        row["mla_after_store_share"] = bound / row["mla_after_store_us"]
    # Each variant is followed by the shipped kernel again, so drift shows.
    row["mla_variants"] = []
    for v in variants:
        k = v["chunks"] or splits
        us = mla(k, partials=v["partials"], least=v["least"], tiles=v["tiles"], buffers=v["buffers"],
                 merge_slice=v["merge_slice"], chains=v["chains"], wgmma=v["wgmma"])
        row["mla_variants"].append({**v, "partials": str(v["partials"]), "chunks": k, "us": us, "share": bound / us,
                                    "max_diff_vs_shipped": max_diff(k, v),
                                    "shipped_after_us": mla(splits)})
        if with_store and v["chunks"]:  # the chunk count alone, as a layer runs it
            row["mla_variants"][-1]["after_store_us"] = after_store(
                bs, ctx, caches, r2t, pool_rows, seq_lens, q, out, layers, k)["mla_after_store_us"]
    row["mla_bf16_us"] = mla(splits, partials=torch.bfloat16)
    row["mla_split_kernel"] = [
        {"splits": k, "min_chunk": least, "lanes": lanes, "us": mla(k, False, least=least, lanes=lanes)}
        for k in splits_tried if k * bs <= 512 and (k - 1) * 64 < ctx for least in mins
        for lanes in sorted({64, triton.next_power_of_2(k)})]
    row["mla_fused"] = [{"splits": k, "us": mla(k, True), "bf16_us": mla(k, True, torch.bfloat16)}
                        for k in fused_tried if k != splits and k * bs <= 512]
    if warps_tried and splits <= triton_mla.FUSED_MERGE_SPLITS:
        row["mla_warps"] = [{"warps": w, "partials": str(dtype).removeprefix("torch."),
                             "us": mla(splits, partials=dtype, tiles=(triton_mla.DECODE_TILES[0], w, 2))}
                            for w in warps_tried for dtype in (torch.float32, torch.bfloat16)]
    if splits > triton_mla.FUSED_MERGE_SPLITS:
        row["merge_alone_us"] = merge_alone_us(bs, splits, seq_lens)
        row["merge_alone_bf16_us"] = merge_alone_us(bs, splits, seq_lens, torch.bfloat16)
        row["merge_alone_fewer_lanes_us"] = merge_alone_us(bs, splits, seq_lens, lanes=triton.next_power_of_2(splits))
    for key in ("torch_sum_us", "flat_us", "flat_dependent_us", "mla_us", "mla_bf16_us"):
        if key in row:
            row[key.replace("_us", "_share")] = bound / row[key]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", help="BSxCONTEXT cases, comma-separated (default: CASES)")
    parser.add_argument("--splits", default=",".join(map(str, SPLIT_TRIES)),
                        help="chunk counts to try on the merge kernel's path, comma-separated ('' for none)")
    parser.add_argument("--mins", default="64",
                        help="the merge kernel's path: least keys a chunk, comma-separated (64: none)")
    parser.add_argument("--fused", default="", help="chunk counts (up to 8) to try with the merge in the last program")
    parser.add_argument("--warps", default="",
                        help="merged in the last program: warps to time the shipped chunks at, fp32 and bf16 partials")
    parser.add_argument("--variants", default="",
                        help="kernel settings to time, ';' between them: chunks:keys,warps,stages:least:partials")
    parser.add_argument("--skip-floor", action="store_true", help="leave out the flat read and torch's sum")
    parser.add_argument("--after-store", action="store_true",
                        help="also time each layer after the step's store, as a model runs it, with dependent "
                             "launches and without")
    parser.add_argument("--dry", action="store_true", help="three tiny cases on the CPU (TRITON_INTERPRET=1)")
    args = parser.parse_args()
    cases = [(bs, ctx, None) for bs, ctx in CASES]
    if args.cases:  # BSxCONTEXT, or BSxCONTEXTpREAL: REAL requests of CONTEXT keys, the rest of one
        cases = [(int(c.split("x")[0]), int(c.split("x")[1].split("p")[0]),
                  int(c.split("p")[1]) if "p" in c else None) for c in args.cases.split(",")]
    if args.dry:
        bench.DEVICE, bench.DTYPE, bench.LAYERS = "cpu", torch.float32, 2
        cases = [(2, 96, None), (20, 64, None), (40, 32, 30)]
    elif not torch.cuda.is_available():
        sys.exit("bench_mla_floor.py needs a GPU (or --dry with TRITON_INTERPRET=1)")
    splits_tried = tuple(int(v) for v in args.splits.split(",") if v)
    variants = tuple(parse_variant(v) for v in args.variants.split(";") if v)
    copy_bs = bench.copy_bandwidth()
    result = {"device": torch.cuda.get_device_name() if bench.DEVICE == "cuda" else "cpu",
              "date": time.strftime("%Y-%m-%d %H:%M:%S"), "torch": torch.__version__,
              "triton": triton.__version__, "copy_bytes_s": copy_bs, "graph_state": bench.GRAPH_STATE, "cases": [],
              "gluon_stage1": gluon_mla.available(torch.device(bench.DEVICE))}
    for bs, ctx, real in cases:
        row = floor_case(bs, ctx, copy_bs, splits_tried, tuple(int(v) for v in args.mins.split(",")),
                         tuple(int(v) for v in args.fused.split(",") if v),
                         tuple(int(v) for v in args.warps.split(",") if v), variants, args.skip_floor,
                         args.after_store, real)
        result["cases"].append(row)
        bench.save_results(result, args.out)
        best = min((t["us"] for t in row["mla_split_kernel"]), default=float("nan"))
        floor = "" if args.skip_floor else (
            f"torch sum {row['torch_sum_us']:.1f} ({row['torch_sum_share']:.0%}) | "
            f"flat {row['flat_us']:.1f} ({row['flat_share']:.0%}) | "
            f"flat dependent {row['flat_dependent_us']:.1f} ({row['flat_dependent_share']:.0%}) | ")
        bench.log(f"bs {bs} x {ctx}{'' if real is None else f' ({real} real)'}: bound {row['bound_us']:.1f} us | {floor}"
                  f"mla {row['mla_us']:.1f} ({row['mla_share']:.0%}) in {row['splits']}, bf16 partials "
                  f"{row['mla_bf16_us']:.1f} | best other split {best:.1f}"
                  + (f" | merge alone {row['merge_alone_us']:.1f}" if "merge_alone_us" in row else ""))
        if args.after_store:
            bench.log(f"  after the store: {row['mla_after_store_us']:.1f} ({row['mla_after_store_share']:.0%}) "
                      f"with dependent launches, {row['mla_after_store_plain_us']:.1f} without, "
                      f"{row['mla_after_store_again_us']:.1f} with again (store alone {row['store_us']:.1f}); "
                      f"max diff {row['max_diff_vs_no_store']:.2g}")
        for v in row["mla_variants"]:
            stored = f", after the store {v['after_store_us']:.1f}" if "after_store_us" in v else ""
            bench.log(f"  {v['spec']}: {v['us']:.1f} ({v['share']:.0%}) in {v['chunks']}, shipped after "
                      f"{v['shipped_after_us']:.1f}, max diff {v['max_diff_vs_shipped']:.2g}{stored}")


if __name__ == "__main__":
    main()
