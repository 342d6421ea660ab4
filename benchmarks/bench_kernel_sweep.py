"""Launch configurations of the dense decode kernel (one chunk length for the batch) and of the
extend kernel over long cached prefixes, side by side, to choose the defaults.

    python3 benchmarks/bench_kernel_sweep.py [--out FILE.json]

Decode: uniform and one-long-request batches (32/8 heads, head_dim 128), each layer's call timed
as a replayed CUDA graph with its chunk plan made beforehand, stage 1 also alone. Extend: one
request's new tokens after a cached prefix, pairs = new x prefix + new x (new + 1) / 2, timed
eagerly (as it runs between piecewise graph pieces); ns a query-key pair, all heads.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_attention import DTYPE, HEAD_DIM, HEADS, KV_HEADS, as_graph, make_pool, time_us

from cgtool.attention import triton_decode, triton_extend
from cgtool.attention.torch_ref import TorchAttentionBackend
from cgtool.runtime.engine import decode_batch, extend_batch

DECODE_CASES = [[4096] * 8, [1024] * 64, [4096] * 64, [1024] * 256, [34000] + [10000] * 19]
DECODE_CONFIGS = [(32, 4, 2), (64, 4, 2), (32, 4, 3), (64, 8, 2), (32, 2, 2), (16, 4, 2)]
EXTEND_CASES = [(2048, 0), (8192, 0), (2048, 16384), (2048, 65536), (8192, 32768)]
EXTEND_CONFIGS = [(128, 64, 4, 2), (128, 64, 8, 2), (128, 128, 8, 2), (64, 64, 4, 2), (128, 64, 8, 3), (64, 128, 4, 2)]


def decode_case(lens: list[int]) -> list[dict]:
    pool, req_rows = make_pool(lens)
    batch = decode_batch(pool, req_rows, [n - 1 for n in lens], [0] * len(lens))
    q = torch.randn(len(lens), HEADS, HEAD_DIM, dtype=DTYPE, device="cuda")
    out = torch.empty_like(q)
    k, v = pool.k_buffers[0], pool.v_buffers[0]

    def step(memo: dict) -> None:
        triton_decode.decode_attention(q, k, v, out, pool.req_to_token, batch.req_pool_indices, batch.seq_lens,
                                       HEAD_DIM ** -0.5, memo=memo)

    rows = []
    for config in DECODE_CONFIGS:
        triton_decode.launch_config = lambda c=config: c
        memo: dict = {}
        triton_decode.chunk_plan(batch.seq_lens, KV_HEADS, memo=memo)
        us = time_us(as_graph(lambda m=memo: step(m)))
        rows.append({"bs": len(lens), "longest": max(lens), "tokens": sum(lens), "config": config, "us": us})
        print(f"decode bs {len(lens):<3} longest {max(lens):<6} BLOCK_N/warps/stages {config}: {us:7.1f} us", flush=True)
    return rows


def sweep_decode() -> list[dict]:
    rows, default = [], triton_decode.launch_config
    for lens in DECODE_CASES:
        rows += decode_case(lens)
        torch.cuda.empty_cache()
    triton_decode.launch_config = default
    return rows


def extend_case(new: int, prefix: int) -> list[dict]:
    from cgtool.attention.triton_backend import TritonAttentionBackend

    pool, req_rows = make_pool([prefix + new])
    batch = extend_batch(pool, req_rows, [prefix], [[0] * new])
    q = torch.randn(new, HEADS * HEAD_DIM, dtype=DTYPE, device="cuda")
    ref = torch.empty_like(q)
    TorchAttentionBackend(HEADS, HEAD_DIM).forward(q, ref, 0, batch, pool)
    pairs = new * prefix + new * (new + 1) / 2
    backend, out, rows = TritonAttentionBackend(HEADS, HEAD_DIM), torch.empty_like(q), []
    for config in EXTEND_CONFIGS:
        triton_extend.launch_config = lambda head_dim, c=config: c
        us = time_us(lambda: backend.forward(q, out, 0, batch, pool), iters=20)
        err = (out.float() - ref.float()).abs().max().item()
        tflops = 4 * HEADS * HEAD_DIM * pairs / us / 1e6
        rows.append({"new": new, "prefix": prefix, "config": config, "us": us, "ns_per_kpair": us * 1e6 / pairs,
                     "tflops": tflops, "max_err": err})
        print(f"extend new {new:<5} prefix {prefix:<6} BLOCK_M/N/warps/stages {config}: {us:9.1f} us "
              f"{tflops:5.0f} TFLOP/s  max err {err:.3f}", flush=True)
    return rows


def sweep_extend() -> list[dict]:
    rows, default = [], triton_extend.launch_config
    for new, prefix in EXTEND_CASES:
        rows += extend_case(new, prefix)
        torch.cuda.empty_cache()
    triton_extend.launch_config = default
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), flush=True)
    result = {"device": torch.cuda.get_device_name(), "decode": sweep_decode(), "extend": sweep_extend()}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
