"""Issue 33: extend attention of a few new tokens over a long cached prefix, keys split or not.

A Mooncake verify measured such steps at 2-3x the planner's estimate (qwen3-30b-a3b, H100: 14
new tokens over a 24,576-token prefix, 73.7 ms a step against 26.0): the extend kernel ran one
program per head and query block through the whole prefix. This times one layer's extend
attention per shape as the kernel ran before (128-row query blocks, keys whole), with the
query blocks sized to the step (up to 64 new tokens) and keys whole, and as the backend now
runs it (blocks sized, keys split as it chooses), against two limits: the keys' K/V read at the copy bandwidth
and the query-key FLOPs at the measured `torch.mm` rate. Equality: each split result's max
|diff| against the unsplit one. Steps of at most SMALL_EXTEND new tokens are also timed with
one q head a program (`one_head_split_us`, the form before heads became rows) and at forced
split counts (`splits_sweep_us`).

    python3 benchmarks/bench_extend_split.py --out extend-split.json [--against OLD_triton_extend.py]

--against times the dense shapes' extend with an older copy of cgtool/attention/triton_extend.py
beside this one, in alternating rounds, at every case (llama-3.1-8b must not be slower).
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import sys
import time

import torch
from bench_moe_mla import copy_bandwidth, graph_us, log, mm_flops, save_results

from cgtool.attention.triton_extend import (
    SMALL_EXTEND,
    extend_attention,
    extend_launch,
    launch_config,
)
from cgtool.attention.triton_mla import EXTEND_TILES, mla_extend_attention

# name: (q heads, kv heads, head dim); deepseek-v2-lite's MLA: 16 heads over one latent of 512 + 64
SHAPES = {"qwen3-30b-a3b": (32, 4, 128), "llama-3.1-8b": (32, 8, 128), "deepseek-v2-lite": (16, 1, 576)}
MLA_RANK = 512
# (new tokens, cached prefix): the Mooncake verify's short steps, then longer ones for contrast
CASES = [(1, 12_546), (14, 24_576), (128, 8192), (300, 8192), (1024, 16_384), (2048, 65_536), (4096, 0)]
SWEEP_SPLITS = (8, 16, 32, 64)


def inputs(heads: int, kv_heads: int, dim: int, new: int, prefix: int, mla: bool) -> tuple:
    """(q, k, v, out, req_to_token, request rows, [prefix, new, start] tensors) of one request of
    `new` tokens over `prefix` cached ones; for MLA, k is the latent pool and v is k."""
    keys = prefix + new
    k = torch.randn(keys + 1, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
    v = k if mla else torch.randn_like(k)
    q = torch.randn(new, heads, dim, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(new, heads, MLA_RANK if mla else dim, device="cuda", dtype=torch.bfloat16)
    req_to_token = torch.arange(1, keys + 1, dtype=torch.int32, device="cuda").view(1, keys)
    rows = torch.zeros(1, dtype=torch.int32, device="cuda")
    lens = [torch.tensor([x], dtype=torch.int32, device="cuda") for x in (prefix, new, 0)]
    return q, k, v, out, req_to_token, rows, lens


def case(heads: int, kv_heads: int, dim: int, new: int, prefix: int, copy_bs: float, peak: float) -> dict:
    keys = prefix + new
    mla = kv_heads == 1 and dim > MLA_RANK
    q, k, v, out, req_to_token, rows, lens = inputs(heads, kv_heads, dim, new, prefix, mla)

    def run(splits: int | None, max_extend_len: int = new, heads: int | None = None) -> torch.Tensor:
        split = {"longest_keys": keys, "new_tokens": new, "kv_splits": splits, "heads": heads}
        if mla:
            mla_extend_attention(q, k, out, req_to_token, rows, *lens, dim**-0.5, max_extend_len, **split)
        else:
            extend_attention(q, k, v, out, req_to_token, rows, *lens, dim**-0.5, max_extend_len, **split)
        return out

    # The kernel before: query blocks of its full height (a grid sized past SMALL_EXTEND new
    # tokens), keys whole.
    before = max(new, SMALL_EXTEND + 1)
    whole = run(1, before).clone()
    split = run(None).clone()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    large_block_m = EXTEND_TILES[0] if mla else launch_config(dim)[0]
    rows_heads, _, _, chosen = extend_launch(heads, heads // kv_heads, 1, new, keys, sms, large_block_m)
    small = {}
    if new <= SMALL_EXTEND:
        one_head = run(None, heads=1).clone()
        small = {
            "one_head_split_us": graph_us(lambda: run(None, heads=1)),
            "one_head_max_abs_diff": (one_head.float() - whole.float()).abs().max().item(),
            "splits_sweep_us": {n: graph_us(lambda n=n: run(n)) for n in SWEEP_SPLITS},
        }
    pairs = new * prefix + new * (new + 1) / 2
    # MLA: one latent row is every head's key and value; its products run over rank + rope and rank.
    read = keys * dim * 2 if mla else keys * kv_heads * dim * 2 * 2
    flops = 2 * pairs * heads * (dim + MLA_RANK) if mla else 4 * pairs * heads * dim
    return {
        "new_tokens": new, "prefix": prefix, "splits": chosen, "heads_a_program": rows_heads,
        "read_us": read / copy_bs * 1e6,
        "flop_us": flops / peak * 1e6,
        "whole_us": graph_us(lambda: run(1, before)), "split_us": graph_us(lambda: run(None)),
        "small_blocks_whole_us": graph_us(lambda: run(1)),
        "max_abs_diff": (split.float() - whole.float()).abs().max().item(), **small,
    }


def against(path: str, heads: int, kv_heads: int, dim: int, new: int, prefix: int) -> dict:
    """This checkout's extend against an older module's, same inputs, three alternating rounds."""
    spec = importlib.util.spec_from_file_location("old_triton_extend", path)
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    keys = prefix + new
    q, k, v, out, req_to_token, rows, lens = inputs(heads, kv_heads, dim, new, prefix, mla=False)
    args = (q, k, v, out, req_to_token, rows, *lens, dim**-0.5, new)
    # An older module that splits keys takes the same split arguments.
    old_split = {"longest_keys": keys, "new_tokens": new} if "longest_keys" in inspect.signature(
        old.extend_attention).parameters else {}
    now, before = [], []
    for _ in range(3):
        now.append(graph_us(lambda: extend_attention(*args, longest_keys=keys, new_tokens=new)))
        before.append(graph_us(lambda: old.extend_attention(*args, **old_split)))
    return {"new_tokens": new, "prefix": prefix, "now_us": now, "before_us": before}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--against", help="an older triton_extend.py to time beside this one")
    args = parser.parse_args()
    copy_bs, peak = copy_bandwidth(), mm_flops()
    result: dict = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
                    "copy_bytes_s": copy_bs, "mm_flops": peak, "cases": {}}
    log(f"{result['device']}: copy {copy_bs / 1e9:.0f} GB/s, bf16 mm {peak / 1e12:.0f} TFLOP/s")
    for name, (heads, kv_heads, dim) in SHAPES.items():
        rows = result["cases"][name] = []
        for new, prefix in CASES:
            row = case(heads, kv_heads, dim, new, prefix, copy_bs, peak)
            rows.append(row)
            save_results(result, args.out)
            bound = max(row["read_us"], row["flop_us"])
            log(f"{name} new={new} prefix={prefix}: whole {row['whole_us']:.1f} us, split x{row['splits']} "
                f"({row['heads_a_program']} heads a program) {row['split_us']:.1f} us, bound {bound:.1f} us "
                f"({100 * bound / row['split_us']:.0f}% split, {100 * bound / row['whole_us']:.0f}% whole); "
                f"max |diff| {row['max_abs_diff']:.3g}"
                + (f"; one head a program {row['one_head_split_us']:.1f} us; forced splits "
                   + ", ".join(f"{n}: {us:.1f}" for n, us in row["splits_sweep_us"].items()) if "one_head_split_us" in row else ""))
            torch.cuda.empty_cache()
    if args.against:
        result["against"] = {"module": args.against, "cases": []}
        for new, prefix in CASES:
            row = against(args.against, *SHAPES["llama-3.1-8b"], new, prefix)
            result["against"]["cases"].append(row)
            save_results(result, args.out)
            log(f"llama-3.1-8b against {args.against}: new={new} prefix={prefix}: now "
                f"{sorted(row['now_us'])[1]:.1f} us, before {sorted(row['before_us'])[1]:.1f} us (medians of 3 rounds)")
            torch.cuda.empty_cache()
    log("done")


if __name__ == "__main__":
    sys.exit(main())
