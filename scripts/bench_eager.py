"""Eager decode step: the lean path against the custom-op path it replaced, in one process.

The old path is restored by patching, not kept in the library: every fused op and the
attention op go through `torch.ops.cgtool.*` (as under torch.compile) and every Triton
launch through Triton's own binder. Prints one JSON object; ratios are within this run.
Usage: python scripts/bench_eager.py --model llama-3.1-8b [--bs 1] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import time
from contextlib import ExitStack
from pathlib import Path
from unittest.mock import patch

import torch

from cgtool.config import load_model_config
from cgtool.capture.timing import host_launch_ms, kernels_per_call, profile_kernels_by_size, time_cuda
from cgtool.triton_launch import CachedKernel
from cgtool.capture.workbench import build_workbench
from cgtool.runners.pool import freeze_gc


def _old_path() -> ExitStack:
    stack = ExitStack()
    stack.enter_context(patch("torch.compiler.is_compiling", lambda: True))
    stack.enter_context(patch.object(
        CachedKernel, "launch", lambda self, grid, *args, **meta: self.fn[grid](*args, **meta)))
    return stack


def host_profile(step, top: int = 25) -> str:
    """Where the host time of five eager steps goes, heaviest functions (own time) first."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def measure(step, label: str) -> dict:
    for _ in range(3):
        step()  # compiles each Triton specialisation once
    with freeze_gc(enable_cudagraph_gc=False, collect=False):  # as the capture session measures
        timing = time_cuda(step, rel_ci=0.01, max_batches=30, budget_s=5.0)
        host = host_launch_ms(step, repeats=11)
    kernels = kernels_per_call(profile_kernels_by_size([(0, step)])[0])
    return {"path": label, "step_ms": timing.mean_ms, "ci95_ms": timing.ci95_ms,
            "host_ms": host, "kernels": kernels, "host_us_per_kernel": host * 1e3 / kernels}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--bs", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    cfg = load_model_config(args.model)
    bench = build_workbench(cfg, weights_dir=None, dtype=torch.bfloat16, mem_fraction_static=0.85,
                            max_bs=args.bs, max_tokens=16, context_len=1024, seed=0)
    batch = bench.decode_batch(args.bs)

    def step() -> torch.Tensor:
        return bench.runner.model.compute_logits(bench.runner.forward_eager(batch))

    lean = measure(step, "lean")
    lean_out = step().float()
    print(host_profile(step))
    with _old_path():
        old = measure(step, "custom ops + Triton binder")
        old_out = step().float()
    result = {
        "model": args.model, "bs": args.bs, "device": torch.cuda.get_device_name(0),
        "date": time.strftime("%Y-%m-%d"), "rows": [lean, old],
        "old_over_lean": old["step_ms"] / lean["step_ms"],
        "max_abs_diff_between_paths": float((lean_out - old_out).abs().max()),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
