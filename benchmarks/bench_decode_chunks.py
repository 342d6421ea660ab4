"""Dense decode attention with one chunk length for the batch, against the kernel it replaced
(a fixed number of chunks a request), on uniform batches and on batches with one long request.

    python3 benchmarks/bench_decode_chunks.py --old OLD_TRITON_DECODE.py [--out FILE.json]

`--old` is the replaced module's source (git show 0440233:cgtool/attention/triton_decode.py),
loaded beside the current one. Each case is timed as a replayed CUDA graph (what serving
runs) and checked against the torch reference; the bound is the K/V bytes read over the
device-to-device copy bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_attention import (
    DTYPE,
    HEAD_DIM,
    HEADS,
    KV_HEADS,
    as_graph,
    copy_bandwidth_gbs,
    make_pool,
    time_us,
)

from cgtool.attention import triton_decode
from cgtool.attention.torch_ref import TorchAttentionBackend
from cgtool.runtime.engine import decode_batch

# (name, context of each request): uniform batches, then one long request among shorter ones
# (the Mooncake slice's decode batches held about 20 requests of 13k tokens, the longest 34k).
CASES = [
    ("uniform", [1024]), ("uniform", [8192]), ("uniform", [32768]),
    ("uniform", [4096] * 8), ("uniform", [1024] * 16), ("uniform", [1024] * 64),
    ("uniform", [4096] * 64), ("uniform", [1024] * 256),
    ("one long", [34000] + [10000] * 19), ("one long", [32000] + [1000] * 7),
    ("one long", [16000] + [1000] * 63), ("one long", [60000] + [2000] * 15),
]


def load_old(path: Path) -> Callable[..., None]:
    spec = importlib.util.spec_from_file_location("old_triton_decode", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def step(q, k, v, out, req_to_token, req_pool_indices, seq_lens, scale) -> None:
        splits = module.num_kv_splits_for(q.shape[0], k.shape[1])
        module.decode_attention(q, k, v, out, req_to_token, req_pool_indices, seq_lens, scale, splits)

    return step


def run_case(lens: list[int], old: Callable[..., None], copy_gbs: float, per_rows: list[int]) -> dict:
    pool, rows = make_pool(lens)
    batch = decode_batch(pool, rows, [n - 1 for n in lens], [0] * len(lens))
    q = torch.randn(len(lens), HEADS * HEAD_DIM, dtype=DTYPE, device="cuda")
    ref = torch.empty_like(q)
    TorchAttentionBackend(HEADS, HEAD_DIM).forward(q, ref, 0, batch, pool)
    kv_bytes = 2 * sum(lens) * KV_HEADS * HEAD_DIM * DTYPE.itemsize
    bound_us = kv_bytes / copy_gbs / 1e3
    row = {"bs": len(lens), "longest": max(lens), "tokens": sum(lens), "bound_us": bound_us}
    out = torch.empty_like(q)
    qh = q.view(len(lens), HEADS, HEAD_DIM)
    scale = HEAD_DIM ** -0.5
    old_step = lambda: old(qh, pool.k_buffers[0], pool.v_buffers[0], out.view_as(qh), pool.req_to_token,
                           batch.req_pool_indices, batch.seq_lens, scale)
    row["old_us"] = time_us(as_graph(old_step))
    row["old_err"] = (out.float() - ref.float()).abs().max().item()
    default = triton_decode.CHUNKS_PER_ROW
    k, v = pool.k_buffers[0], pool.v_buffers[0]
    for per_row in per_rows:
        triton_decode.CHUNKS_PER_ROW = per_row
        # A layer's call, the chunk plan made beforehand: a forward plans once for all its
        # layers (forward_memo). The plan's own kernel is timed apart.
        memo: dict = {}
        triton_decode.chunk_plan(batch.seq_lens, KV_HEADS, memo=memo)
        new_step = lambda m=memo: triton_decode.decode_attention(
            qh, k, v, out.view_as(qh), pool.req_to_token, batch.req_pool_indices, batch.seq_lens, scale,
            memo=m,
        )
        label = f"new_{per_row}"
        row[f"{label}_us"] = time_us(as_graph(new_step))
        row[f"{label}_err"] = (out.float() - ref.float()).abs().max().item()
        if per_row == default:
            row["plan_us"] = time_us(as_graph(lambda: triton_decode.chunk_plan(batch.seq_lens, KV_HEADS)))
    triton_decode.CHUNKS_PER_ROW = default
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--old", type=Path, required=True)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--per-row", default=f"{triton_decode.CHUNKS_PER_ROW},0,31",
                        help="chunks aimed for a real row (CHUNKS_PER_ROW), the first the default")
    args = parser.parse_args()
    targets = [int(c) for c in args.per_row.split(",")]
    copy_gbs = copy_bandwidth_gbs()
    print(f"{torch.cuda.get_device_name()}  copy bandwidth {copy_gbs:.0f} GB/s  heads {HEADS}/{KV_HEADS} "
          f"head_dim {HEAD_DIM}; graph replay us (% of the K/V read bound); new kernel at chunks a row {targets}")
    rows = []
    for name, lens in CASES:
        row = run_case(lens, load_old(args.old), copy_gbs, targets) | {"case": name}
        rows.append(row)
        torch.cuda.empty_cache()  # the case's pool is gone with run_case's frame
        news = "  ".join(
            f"{k[4:-3]} {row[k]:7.1f} ({100 * row['bound_us'] / row[k]:3.0f}%)"
            for k in row if k.startswith("new_") and k.endswith("_us")
        )
        errs = max(v for k, v in row.items() if k.endswith("_err"))
        print(f"{name:<8} bs {row['bs']:<3} longest {row['longest']:<6} tokens {row['tokens']:<7} "
              f"bound {row['bound_us']:6.1f}  old {row['old_us']:7.1f} ({100 * row['bound_us'] / row['old_us']:3.0f}%)  "
              f"{news}  plan {row['plan_us']:5.1f}  max err {errs:.3f}", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "copy_gbs": copy_gbs,
                                        "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
