"""Does Triton pipeline cgtool's grouped MoE GEMM? Times it, and a plain Triton GEMM beside
it, at 1-5 pipeline stages (a loop Triton pipelines gets faster with stages; one it does not
stays flat), against torch.mm.

    python3 benchmarks/bench_gemm_stages.py --out stages.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import triton
import triton.language as tl
from bench_attention import time_us as attention_time_us  # benchmarks/ is the script's path

from cgtool.model.moe_routing import align_block_size, route_topk, router_logits
from cgtool.model.moe_triton import CONFIGS, GemmTiles, grouped_gemm

DTYPE = torch.bfloat16


@triton.jit
def _plain_mm(A, B, C, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    om = tl.program_id(0) * BM + tl.arange(0, BM)
    on = tl.program_id(1) * BN + tl.arange(0, BN)
    ok = tl.arange(0, BK)
    a_ptrs = A + om[:, None].to(tl.int64) * K + ok[None, :]
    b_ptrs = B + on[None, :].to(tl.int64) * K + ok[:, None]  # B is [N, K], as the experts' weights
    acc = tl.zeros((BM, BN), tl.float32)
    for _ in range(0, K, BK):
        acc = tl.dot(tl.load(a_ptrs), tl.load(b_ptrs), acc)
        a_ptrs += BK
        b_ptrs += BK
    tl.store(C + om[:, None].to(tl.int64) * N + on[None, :], acc.to(C.dtype.element_ty))


def time_us(fn, iters: int = 10) -> float:
    """bench_attention's event timing; nan where the stages do not fit the SM's shared memory."""
    try:
        return attention_time_us(fn, iters)
    except triton.runtime.errors.OutOfResources:
        return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out: dict = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                 "triton": triton.__version__}
    size = 8192
    a, b = torch.randn(size, size, device="cuda", dtype=DTYPE), torch.randn(size, size, device="cuda", dtype=DTYPE)
    c = torch.empty(size, size, device="cuda", dtype=DTYPE)
    flops = 2 * size**3
    out["torch_mm_tflops"] = flops / time_us(lambda: a @ b.T) / 1e6
    out["plain"] = []
    for warps in (4, 8):
        for stages in (1, 2, 3, 4, 5):
            us = time_us(lambda: _plain_mm[(size // 128, size // 128)](a, b, c, size, size, size, BM=128, BN=128,
                                                                        BK=64, num_warps=warps, num_stages=stages))
            out["plain"].append({"warps": warps, "stages": stages, "tflops": flops / us / 1e6})
            print(f"plain 128x128x64 warps {warps} stages {stages}: {flops / us / 1e6:.0f} TFLOP/s", flush=True)
    # qwen3-30b-a3b's experts at 8,192 tokens, random routing
    num_experts, top_k, hidden, inter, tokens = 128, 8, 2048, 768, 8192
    x = torch.randn(tokens, hidden, device="cuda", dtype=DTYPE)
    gate_up = (torch.randn(num_experts, 2 * inter, hidden, device="cuda") * hidden**-0.5).to(DTYPE)
    down = (torch.randn(num_experts, hidden, inter, device="cuda") * inter**-0.5).to(DTYPE)
    router = (torch.randn(num_experts, hidden, device="cuda") * hidden**-0.5).to(DTYPE)
    weights, ids = route_topk(router_logits(x, router), top_k, True, 1.0)
    config = CONFIGS[-1][1]
    align = align_block_size(ids, num_experts, config.block_m)
    act = torch.empty(tokens * top_k, inter, device="cuda", dtype=DTYPE)
    y = torch.empty(tokens * top_k, hidden, device="cuda", dtype=torch.float32)
    pair_weights = weights.reshape(-1).contiguous()
    up_flops, down_flops = tokens * top_k * 2 * inter * hidden * 2, tokens * top_k * hidden * inter * 2
    out["grouped"] = []
    for stages in (1, 2, 3, 4, 5):
        up = GemmTiles(config.up.block_n, config.up.block_k, config.up.num_warps, stages)
        dn = GemmTiles(config.down.block_n, config.down.block_k, config.down.num_warps, stages)
        up_us = time_us(lambda: grouped_gemm(x, gate_up, act, align, pair_weights, top_k, config.block_m, up,
                                             mul_weight=False, gated=True))
        down_us = time_us(lambda: grouped_gemm(act, down, y, align, pair_weights, 1, config.block_m, dn,
                                               mul_weight=True, gated=False))
        out["grouped"].append({"stages": stages, "up_us": up_us, "down_us": down_us,
                               "up_tflops": up_flops / up_us / 1e6, "down_tflops": down_flops / down_us / 1e6})
        print(f"grouped stages {stages}: up {up_us:.0f} us ({up_flops / up_us / 1e6:.0f} TFLOP/s), "
              f"down {down_us:.0f} us ({down_flops / down_us / 1e6:.0f} TFLOP/s)", flush=True)
    print(f"torch.mm {out['torch_mm_tflops']:.0f} TFLOP/s", flush=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
