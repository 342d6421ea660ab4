"""Decode-size linear layers of llama-3.1-8b on the GPU: cuBLAS (F.linear) against a
pre-transposed weight, cuBLASLt, a plain Triton GEMV and a split-K one, as % of the
copy-bandwidth roofline.

With --cold, each call reads the next of enough weight copies to overflow the L2 cache
(50 MB on the H100), as a forward reading 32 layers does; otherwise a 4096x4096 weight
stays in L2 between calls and reads optimistic.

Issue 14: a bs-1 replay's kernel trace had o_proj (4096x4096) at ~53% of the weight-read
bound while qkv, gate_up, down and the LM head ran at 95-100%. Run on the GPU machine:
  python3 benchmarks/bench_linear.py [--out FILE.json]
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


@triton.jit
def _gemv_split_k(X, W, Part, K, stride_xm, stride_wn, M, N,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_PER_SPLIT: tl.constexpr):
    m, pid, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(split * K_PER_SPLIT, (split + 1) * K_PER_SPLIT, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(X + m * stride_xm + cols).to(tl.float32)
        w = tl.load(W + rows[:, None] * stride_wn + cols[None, :]).to(tl.float32)
        acc += tl.sum(w * x[None, :], axis=1)
    tl.store(Part + (split * M + m) * N + rows, acc)


@triton.jit
def _sum_splits(Part, Out, MN, SPLITS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLITS):
        acc += tl.load(Part + s * MN + offs, mask=mask, other=0.0)
    tl.store(Out + offs, acc.to(Out.dtype.element_ty), mask=mask)


def triton_split_k(x: torch.Tensor, w: torch.Tensor, block_n: int, block_k: int, splits: int,
                   warps: int) -> torch.Tensor:
    m, k = x.shape
    n = w.shape[0]
    part = torch.empty((splits, m, n), dtype=torch.float32, device=x.device)
    _gemv_split_k[(m, n // block_n, splits)](
        x, w, part, k, x.stride(0), w.stride(0), m, n,
        BLOCK_N=block_n, BLOCK_K=block_k, K_PER_SPLIT=k // splits, num_warps=warps,
    )
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    _sum_splits[(triton.cdiv(m * n, 1024),)](part, out, m * n, SPLITS=splits, BLOCK=1024, num_warps=4)
    return out


class Rotating:
    """Calls `fn(x, w_i)` over weight copies in turn, so that none is still in L2."""

    def __init__(self, fn, x, weights):
        self.fn, self.x, self.weights, self.i = fn, x, weights, 0

    def __call__(self):
        self.i = (self.i + 1) % len(self.weights)
        return self.fn(self.x, self.weights[self.i])


def with_blas(library: str, fn):
    def call(*args):
        torch.backends.cuda.preferred_blas_library(library)
        try:
            return fn(*args)
        finally:
            torch.backends.cuda.preferred_blas_library("cublas")
    return call


def triton_gemv(x: torch.Tensor, w: torch.Tensor, block_n: int, block_k: int, warps: int) -> torch.Tensor:
    out = torch.empty((x.shape[0], w.shape[0]), dtype=x.dtype, device=x.device)
    _gemv[(x.shape[0], w.shape[0] // block_n)](
        x, w, out, w.shape[1], x.stride(0), w.stride(0), out.stride(0),
        BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps,
    )
    return out


KEEP: list = []  # every graph stays alive until exit


def graph_us(call, keep: list, reps: int = 24) -> float:
    """Per-call GPU time of `reps` calls captured in one CUDA graph, as a decode replay runs
    them: the host's launch cost (several times a small GEMV's) is then not in the figure."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            call()
    keep.append(graph)
    return time_cuda(graph.replay, rel_ci=0.01, budget_s=0.2).mean_ms * 1e3 / reps


def _plain(bn, bk, nw, x, w):
    return triton_gemv(x, w, bn, bk, nw)


def _split(bn, bk, sp, nw, x, w):
    return triton_split_k(x, w, bn, bk, sp, nw)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--cold", action="store_true", help="rotate weight copies past the L2 cache")
    parser.add_argument("--m", default="1,2,4,8")
    args = parser.parse_args()
    bw = copy_bandwidth_bytes_s()
    rows = []
    for name, (k, n) in SHAPES.items():
        copies = max(1, (192 << 20) // (n * k * 2)) if args.cold else 1
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 64 for _ in range(copies)]
        wts = [w.t().contiguous() for w in ws]
        bound_us = n * k * 2 / bw * 1e6
        for m in [int(v) for v in args.m.split(",")]:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = F.linear(x, ws[0]).float()
            cands = {"F.linear": (F.linear, ws), "x @ Wt (NN)": (torch.mm, wts),
                     "F.linear cublaslt": (with_blas("cublaslt", F.linear), ws)}
            for bn, bk, nw in ((8, 512, 4), (16, 256, 4)):
                cands[f"triton {bn}x{bk} w{nw}"] = (partial(_plain, bn, bk, nw), ws)
            for bn, bk, sp, nw in ((8, 512, 4, 4), (8, 256, 8, 4), (16, 256, 4, 4), (4, 512, 8, 4), (16, 512, 2, 8)):
                cands[f"splitk {bn}x{bk}/{sp} w{nw}"] = (partial(_split, bn, bk, sp, nw), ws)
            for label, (fn, weights) in cands.items():
                err = float((fn(x, weights[0]).float() - ref).abs().max())
                us = graph_us(Rotating(fn, x, weights), KEEP)
                rows.append({"layer": name, "m": m, "path": label, "us": us, "bound_pct": 100 * bound_us / us,
                             "max_err": err, "cold": args.cold})
                print(f"{name:8s} m={m} {label:22s} {us:8.2f} us {100 * bound_us / us:5.1f}% of bound  err {err:.2e}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"copy_bandwidth_bytes_s": bw, "device": torch.cuda.get_device_name(0), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
