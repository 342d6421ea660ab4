"""Issue 33: where MLA decode's time goes at short contexts, program by program.

MLA decode reaches 77-92% of its latent-read roofline at 8k-token contexts and at bs 256, but
23-48% at 1k contexts below bs 256 (docs/moe-mla.md). This replays the bench's graph of LAYERS
decode launches with stage 1's timestamps on (`cgtool.runtime.kernel_trace`) and reports, per
case, how the launch's time divides:

- ramp: how late the last program started after the first;
- before the loop: from a program's start until its request's row is known;
- loop: the online softmax over its chunk's keys;
- ticket: writing the partial output and taking the ticket;
- merge: the last program's merge of the request's chunks;
- the gap from one launch's last program to the next launch's first, and programs per SM.

The same graph without stamps is timed beside it, so the stamps' own cost shows. Each case
runs in VARIANTS: launches back to back, and each after a torch kernel writing q (as the
model's `torch.cat(...) * scale` does), with the partials in the shipped dtype and in bf16,
with wider merge slices, and (--against) as an older copy of cgtool/attention/triton_mla.py
computes it. A variant named twice in --variants runs twice, so rounds can alternate. It times
triton_mla's stage 1 (`buffers=0`), not gluon_mla's, which has no stamps; the `wgmma` variants
time gluon_mla_wgmma's stage 1, as shipped, with q loaded first or last (Q_FIRST), with a
one-chunk request merged or written at once (ONE_CHUNK_DIRECT), and with a request's chunks
capped at 1-3 (CHUNK_CAPS), and with its programs mapped to chunks flat or by the grid
(FLAT_CHUNKS). A case is BSxCONTEXT or a mix such as 19x512+1x8192.

    python3 benchmarks/probe_mla_timeline.py --out timeline.json [--cases 64x1024,256x1024]
        [--variants shipped,against,shipped,against --against OLD_triton_mla.py]
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import statistics
import sys
from contextlib import contextmanager
from itertools import pairwise

import torch
from bench_moe_mla import (
    DTYPE,
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

from cgtool.attention import gluon_mla_wgmma, triton_mla
from cgtool.attention.triton_mla import mla_decode_attention, mla_num_kv_splits
from cgtool.runtime.kernel_trace import TRACE_SLOTS
from cgtool.runtime.triton_launch import cdiv

CASES = [(1, 1024), (16, 1024), (32, 1024), (64, 1024), (256, 1024), (16, 8192), (64, 8192)]
PHASES = ("before_loop", "loop", "ticket", "merge")
# name: (a torch kernel before each launch, the partials' dtype or None for the shipped one,
# triton_mla's constants set otherwise for the variant, and None for triton_mla's stage 1 or
# gluon_mla_wgmma's constants for its stage 1)
VARIANTS = {
    "shipped": (False, None, {}, None), "after_op": (True, None, {}, None),
    "bf16_partials": (False, torch.bfloat16, {}, None), "after_op_bf16_partials": (True, torch.bfloat16, {}, None),
    "merge_slice_256": (False, None, {"MERGE_SLICE": 256}, None),
    "merge_slice_512": (False, None, {"MERGE_SLICE": 512}, None),
    "against": (False, None, {}, None),  # the --against module's kernel
    "wgmma": (False, None, {}, {}),
    "wgmma_q_first": (False, None, {}, {"Q_FIRST": True}), "wgmma_q_last": (False, None, {}, {"Q_FIRST": False}),
    "wgmma_vec8": (False, None, {}, {"PARTIAL_VEC": 8}), "wgmma_vec4": (False, None, {}, {"PARTIAL_VEC": 4}),
    "wgmma_direct": (False, None, {}, {"ONE_CHUNK_DIRECT": True}),
    "wgmma_merged": (False, None, {}, {"ONE_CHUNK_DIRECT": False}),
    "wgmma_spares_first": (False, None, {}, {"SPARES_FIRST": True}),
    "wgmma_spares_last": (False, None, {}, {"SPARES_FIRST": False}),
    "wgmma_cap1": (False, None, {}, {}), "wgmma_cap2": (False, None, {}, {}), "wgmma_cap3": (False, None, {}, {}),
    "wgmma_flat": (False, None, {}, {"FLAT_CHUNKS": True}), "wgmma_grid": (False, None, {}, {"FLAT_CHUNKS": False}),
    "default": (False, None, {}, None),  # mla_decode_attention's own choice untraced; traced, triton_mla's
}
# Variants that cap a request's chunks below mla_num_kv_splits' count.
CHUNK_CAPS = {"wgmma_cap1": 1, "wgmma_cap2": 2, "wgmma_cap3": 3}


def spread(values: list[float]) -> dict[str, float]:
    """min / median / max of one phase over a launch's programs, in microseconds."""
    if not values:
        return {}
    return {"min": min(values) / 1e3, "median": statistics.median(values) / 1e3, "max": max(values) / 1e3}


def launch_summary(rows: list[list[int]]) -> dict:
    """One launch's programs (sm, start, row known, loop end, ticket, merge end) summarised."""
    ran = [r for r in rows if r[1] > 0]
    start = min(r[1] for r in ran)
    ends = [max(r[1:6]) for r in ran]
    looped = [r for r in ran if r[3] > 0]
    per_sm: dict[int, int] = {}
    for r in ran:
        per_sm[r[0]] = per_sm.get(r[0], 0) + 1
    return {
        "programs": len(ran), "sms": len(per_sm), "max_programs_on_one_sm": max(per_sm.values()),
        "span_us": (max(ends) - start) / 1e3,
        "ramp_us": (max(r[1] for r in ran) - start) / 1e3,
        "before_loop": spread([r[2] - r[1] for r in looped]),
        "loop": spread([r[3] - r[2] for r in looped]),
        "ticket": spread([r[4] - r[3] for r in looped if r[4] > 0]),
        # A merge's stamp left by an earlier replay (another program merged then) is older
        # than this replay's ticket.
        "merge": spread([r[5] - r[4] for r in ran if r[5] > r[4] > 0]),
        "first_start_ns": start, "last_end_ns": max(ends),
    }


def clock_step_ns(rows: list[list[int]]) -> int:
    """The smallest nonzero difference between stamps: how fine the global clock ticks here."""
    stamps = sorted({v for r in rows for v in r[1:6] if v > 0})
    steps = [b - a for a, b in pairwise(stamps) if b > a]
    return min(steps) if steps else 0


def load_module(path: str):
    """An older copy of triton_mla.py, imported under its own name."""
    spec = importlib.util.spec_from_file_location("against_triton_mla", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextmanager
def overridden(module, values: dict):
    """`module`'s constants set to `values` for the calls inside (read at each call)."""
    shipped = {name: getattr(module, name) for name in values}
    for name, value in values.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in shipped.items():
            setattr(module, name, value)


def parse_case(text: str) -> list[int]:
    """A case's lengths: "32x1024" is 32 requests of 1,024 keys; "19x512+1x8192" mixes them."""
    lens: list[int] = []
    for part in text.split("+"):
        count, keys = (int(v) for v in part.split("x"))
        lens += [keys] * count
    return lens


def timeline_case(lens: list[int], copy_bs: float, variant: str, against=None) -> dict:
    with overridden(triton_mla, VARIANTS[variant][2]), overridden(gluon_mla_wgmma, VARIANTS[variant][3] or {}):
        return _timeline_case(lens, copy_bs, variant, against)


def _stage1(variant: str, against):
    """The decode call a variant times, with stamps: triton_mla's stage 1 (the default stage 1
    on Hopper, gluon_mla's, takes none), the --against module's, or gluon_mla_wgmma's."""
    if variant == "against":
        return against.mla_decode_attention
    if variant == "default":
        return mla_decode_attention
    if VARIANTS[variant][3] is not None:
        return functools.partial(mla_decode_attention, wgmma=True)
    return functools.partial(mla_decode_attention, buffers=0)


def _timeline_case(lens: list[int], copy_bs: float, variant: str, against) -> dict:
    after_op, partial_dtype, _, _ = VARIANTS[variant]
    decode = _stage1(variant, against)
    bs, ctx = len(lens), max(lens)
    layers = 2 if sum(lens) >= 64 * 8192 else LAYERS
    caches, r2t, rows = latent_setup(lens, layers)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    q = torch.randn(bs, MLA_HEADS, RANK + ROPE, device="cuda").to(DTYPE)
    q_source = q.clone()
    out = torch.empty(bs, MLA_HEADS, RANK, device="cuda", dtype=DTYPE)
    splits = CHUNK_CAPS.get(variant) or (
        against.mla_num_kv_splits if variant == "against" else mla_num_kv_splits)(bs, MLA_HEADS)
    # The grid's programs: (bs, head blocks, splits), or gluon_mla_wgmma's flat WGMMA_PROGRAMS + bs.
    programs = max(bs * cdiv(MLA_HEADS, 16) * splits, triton_mla.WGMMA_PROGRAMS + bs)
    traces = torch.zeros(layers, programs, TRACE_SLOTS, dtype=torch.int64, device="cuda")

    def run(traced: bool):
        for i, c in enumerate(caches):
            if after_op:
                torch.mul(q_source, 1.0, out=q)
            decode(q, c, out, r2t, rows, seq_lens, 0.07, splits, None,
                   trace=traces[i] if traced else None, partial_dtype=partial_dtype)

    reference = torch.empty_like(out)
    mla_decode_attention(q, caches[0], reference, r2t, rows, seq_lens, 0.07, splits, None, buffers=0)
    decode(q, caches[0], out, r2t, rows, seq_lens, 0.07, splits, None, partial_dtype=partial_dtype)
    diff = (out.float() - reference.float()).abs().max().item()
    plain_us = graph_us(lambda: run(False)) / layers
    traced_us = graph_us(lambda: run(True)) / layers  # the last replay's stamps stay in `traces`
    launches = [launch_summary(traces[i].tolist()) for i in range(layers)]
    gaps = [(launches[i + 1]["first_start_ns"] - launches[i]["last_end_ns"]) / 1e3 for i in range(layers - 1)]
    return {
        "bs": bs, "context": ctx, "lens": lens if len(set(lens)) > 1 else None, "variant": variant, "splits": splits,
        "programs": programs, "layers": layers,
        "bound_us": sum(lens) * (RANK + ROPE) * DTYPE.itemsize / copy_bs * 1e6,
        "us": plain_us, "traced_us": traced_us, "max_abs_diff_vs_shipped_partials": diff, "gaps_between_launches_us": gaps,
        "clock_step_ns": clock_step_ns(traces[-1].tolist()),
        "launches": launches,
        # One launch's stamps, raw, for the kernel as shipped (the other variants' summaries suffice).
        **({"last_launch_raw": traces[-1].tolist()} if variant in ("shipped", "wgmma") else {}),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", help="BSxCONTEXT,... or mixes such as 19x512+1x8192 (default: all of CASES)")
    parser.add_argument("--variants", default="shipped,after_op,bf16_partials,after_op_bf16_partials",
                        help="of " + ", ".join(VARIANTS))
    parser.add_argument("--against", help="an older triton_mla.py, for the 'against' variant")
    args = parser.parse_args()
    against = load_module(args.against) if args.against else None
    cases = [parse_case(c) for c in args.cases.split(",")] if args.cases else [[ctx] * bs for bs, ctx in CASES]
    copy_bs = copy_bandwidth()
    result: dict = {"device": torch.cuda.get_device_name(), "copy_bytes_s": copy_bs, "against": args.against,
                    "cases": []}
    log(f"{result['device']}: copy {copy_bs / 1e9:.0f} GB/s")
    for lens, variant in ((c, v) for c in cases for v in args.variants.split(",")):
        row = timeline_case(lens, copy_bs, variant, against)
        bs, ctx = row["bs"], ("mixed " if row["lens"] else "") + str(sum(lens) // len(lens))
        result["cases"].append(row)
        save_results(result, args.out)
        mid = row["launches"][len(row["launches"]) // 2]
        log(f"bs={bs} ctx={ctx} {variant} splits={row['splits']}: {row['us']:.1f} us a layer ({row['traced_us']:.1f} traced), "
            f"bound {row['bound_us']:.1f}; launch span {mid['span_us']:.1f}, ramp {mid['ramp_us']:.1f}, "
            + ", ".join(f"{p} {mid[p].get('median', 0):.1f} (max {mid[p].get('max', 0):.1f})" for p in PHASES)
            + f"; gaps {[round(g, 1) for g in row['gaps_between_launches_us']]}; "
            f"{mid['programs']} programs on {mid['sms']} SMs, at most {mid['max_programs_on_one_sm']} on one; "
            f"clock step {row['clock_step_ns']} ns; max |diff| against the shipped partials "
            f"{row['max_abs_diff_vs_shipped_partials']:.3g}")
        del row
        torch.cuda.empty_cache()
    log("done")


if __name__ == "__main__":
    sys.exit(main())
