"""Decode-size linear layers of llama-3.1-8b on the GPU: cuBLAS (F.linear) against a
pre-transposed weight and a plain Triton GEMV, as % of the copy-bandwidth roofline.

Issue 14: a bs-1 replay's kernel trace had o_proj (4096x4096) at ~53% of the weight-read
bound while qkv, gate_up, down and the LM head ran at 95-100%. Run on the GPU machine:
  python3 scripts/bench_linear.py [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
from functools import partial

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from cgtool.capture.timing import copy_bandwidth_bytes_s, time_cuda

SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096)}


@triton.jit
def _gemv(X, W, Out, K, stride_xm, stride_wn, stride_om, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    m, pid = tl.program_id(0), tl.program_id(1)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(X + m * stride_xm + cols).to(tl.float32)
        w = tl.load(W + rows[:, None] * stride_wn + cols[None, :]).to(tl.float32)
        acc += tl.sum(w * x[None, :], axis=1)
    tl.store(Out + m * stride_om + rows, acc.to(Out.dtype.element_ty))


def triton_gemv(x: torch.Tensor, w: torch.Tensor, block_n: int, block_k: int, warps: int) -> torch.Tensor:
    out = torch.empty((x.shape[0], w.shape[0]), dtype=x.dtype, device=x.device)
    _gemv[(x.shape[0], w.shape[0] // block_n)](
        x, w, out, w.shape[1], x.stride(0), w.stride(0), out.stride(0),
        BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps,
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    args = parser.parse_args()
    bw = copy_bandwidth_bytes_s()
    rows = []
    for name, (k, n) in SHAPES.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 64
        wt = w.t().contiguous()
        bound_us = n * k * 2 / bw * 1e6
        for m in (1, 2, 4, 8):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = F.linear(x, w).float()
            cands = {"F.linear": partial(F.linear, x, w), "x @ Wt (NN)": partial(torch.mm, x, wt)}
            for bn, bk, nw in ((4, 512, 4), (8, 512, 4), (16, 256, 4), (16, 512, 8), (32, 256, 8)):
                cands[f"triton {bn}x{bk} w{nw}"] = partial(triton_gemv, x, w, bn, bk, nw)
            for label, fn in cands.items():
                err = float((fn().float() - ref).abs().max())
                us = time_cuda(fn, rel_ci=0.01, budget_s=0.2, back_to_back_below_ms=25.0).mean_ms * 1e3
                rows.append({"layer": name, "m": m, "path": label, "us": us, "bound_pct": 100 * bound_us / us, "max_err": err})
                print(f"{name:8s} m={m} {label:22s} {us:8.2f} us {100 * bound_us / us:5.1f}% of bound  err {err:.2e}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"copy_bandwidth_bytes_s": bw, "device": torch.cuda.get_device_name(0), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
