"""Eager decode step: the lean path against the paths it replaced, in one process.

The old path is restored by patching, not kept in the library: every fused op and the
attention op go through `torch.ops.cgtool.*` (as under torch.compile) and every Triton
launch through Triton's own binder. Prints one JSON object; ratios are within this run.
Usage: python benchmarks/bench_eager.py --model llama-3.1-8b [--bs 1] [--out FILE]
       [--after-compile | --after-captures]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import ExitStack
from pathlib import Path
from unittest.mock import patch

import torch

from cgtool.capture.timing import (
    host_launch_ms,
    kernels_per_call,
    plain_torch_host_us,
    profile_kernels_by_size,
    t95,
    timed_call,
)
from cgtool.capture.workbench import build_workbench
from cgtool.runners.pool import freeze_gc
from cgtool.runtime.triton_launch import CachedKernel
from cgtool.specs.config import load_model_config


def _old_path() -> ExitStack:
    stack = ExitStack()
    stack.enter_context(patch("torch.compiler.is_compiling", lambda: True))
    stack.enter_context(patch.object(
        CachedKernel, "launch", lambda self, grid, *args, **meta: self.fn[grid](*args, **meta)))
    return stack


def _allocating_path() -> ExitStack:
    """The lean path as it stood before the norms wrote over their inputs, the layers
    shared their per-layer outputs and linears skipped `at::linear` (benchmarks r8). Triton
    launches stay as they are now."""
    import torch.nn.functional as F

    from cgtool.model import fused, fused_launch, layers, llama, parallel

    def new_tensor(name, shape, dtype, device):
        return torch.empty(shape, dtype=dtype, device=device)

    stack = ExitStack()
    stack.enter_context(patch.object(layers, "fused_add_rms_norm_", fused.fused_add_rms_norm))
    stack.enter_context(patch.object(llama, "scratch_empty", new_tensor))
    stack.enter_context(patch.object(fused_launch, "scratch_empty", new_tensor))
    stack.enter_context(patch.object(parallel, "linear", lambda x, w, b=None, weight_t=None: F.linear(x, w, b)))
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


def measure_interleaved(step, paths: dict, rounds: int = 30) -> list[dict]:
    """Each round times one step on every path, back to back: the host's speed moves during
    a run (2x between runs, issue 14), and timing the paths one after the other measured the
    drift, not the paths. `paths` maps a label to the context that selects that path."""
    for enter in paths.values():
        with enter():
            for _ in range(3):
                step()  # compiles each Triton specialisation once
    steps = {label: [] for label in paths}
    hosts = {label: [] for label in paths}
    with freeze_gc(enable_cudagraph_gc=False, collect=False):  # as the capture session measures
        for _ in range(rounds):
            for label, enter in paths.items():
                with enter():
                    steps[label].append(timed_call(step)[1])
                    hosts[label].append(host_launch_ms(step, repeats=1))
    rows = []
    for label, enter in paths.items():
        with enter():
            kernels = kernels_per_call(profile_kernels_by_size([(0, step)])[0])
        ms, host = steps[label], statistics.median(hosts[label])
        rows.append({"path": label, "step_ms_median": statistics.median(ms), "step_ms_mean": statistics.fmean(ms),
                     "ci95_ms": t95(len(ms) - 1) * statistics.stdev(ms) / len(ms) ** 0.5,
                     "host_ms": host, "kernels": kernels, "host_us_per_kernel": host * 1e3 / kernels})
    return rows


def _after_compile(bench, step) -> dict:
    """The lean path again, after dynamo has compiled the piecewise body in this process."""
    from cgtool.runners.piecewise import PiecewiseGraphRunner

    runner = PiecewiseGraphRunner(bench.runner, capture_num_tokens=[4, 8, 16])
    runner.warmup()
    (row,) = measure_interleaved(step, {"lean, after dynamo compiled the body": ExitStack})
    return row


def _after_captures(bench, step) -> tuple[dict, object]:
    """The lean path again, once the 36 default decode graphs are captured in this process, as
    a session measures eager after capturing: sessions read the bs-1 step at up to 1.5x this
    bench's on one host (benchmarks r8). Returns the row and the runner, kept alive."""
    from cgtool.runners.decode import DecodeGraphRunner

    runner = DecodeGraphRunner(bench.runner, [1, 2, 4, *range(8, 257, 8)])
    runner.capture()
    (row,) = measure_interleaved(step, {"lean, after 35 decode graphs were captured": ExitStack})
    return row, runner


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--bs", type=int, default=1)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--extend", type=int, default=0,
                        help="time a prefill of this many tokens (piecewise's eager path) instead of decode")
    parser.add_argument("--after-compile", action="store_true",
                        help="also time the lean path again once the piecewise body is compiled, "
                             "as it runs in a `--kind both` session")
    parser.add_argument("--after-captures", action="store_true",
                        help="also time the lean path again once the default decode graphs are captured")
    args = parser.parse_args()
    cfg = load_model_config(args.model)
    bench = build_workbench(cfg, weights_dir=None, dtype=torch.bfloat16, mem_fraction_static=0.85,
                            max_bs=args.bs, max_tokens=max(16, args.extend), context_len=1024, seed=0)
    batch = bench.extend_batch(args.extend) if args.extend else bench.decode_batch(args.bs)

    def step() -> torch.Tensor:
        hidden = bench.runner.forward_eager(batch)
        return bench.runner.model.compute_logits(hidden[-1:] if args.extend else hidden)

    result = {"model": args.model, "bs": args.bs, "extend_tokens": args.extend, "device": torch.cuda.get_device_name(0),
              "date": time.strftime("%Y-%m-%d")}
    if args.after_captures:
        (lean,) = measure_interleaved(step, {"lean": ExitStack})
        after, _kept = _after_captures(bench, step)
        result["rows"] = [lean, after]
        result["after_over_before_median"] = after["step_ms_median"] / lean["step_ms_median"]
    elif args.after_compile:
        # Patching is_compiling (the old path) before dynamo runs breaks dynamo's handling of
        # it, so this mode times the lean path alone, before and after the compile.
        (lean,) = measure_interleaved(step, {"lean": ExitStack})
        result["rows"] = [lean, _after_compile(bench, step)]
        result["after_over_before_median"] = result["rows"][1]["step_ms_median"] / lean["step_ms_median"]
        print(host_profile(step))
    else:
        lean, allocating, old = measure_interleaved(step, {
            "lean": ExitStack, "lean, r8 allocations and linears": _allocating_path,
            "custom ops + Triton binder": _old_path})
        lean_out = step().float()
        print(host_profile(step))
        with _allocating_path():
            allocating_out = step().float()
        with _old_path():
            old_out = step().float()
        result["rows"] = [lean, allocating, old]
        result["allocating_over_lean_median"] = allocating["step_ms_median"] / lean["step_ms_median"]
        result["old_over_lean_median"] = old["step_ms_median"] / lean["step_ms_median"]
        result["max_abs_diff_between_paths"] = max(
            float((lean_out - other).abs().max()) for other in (allocating_out, old_out))
    # The host's own speed, beside each path's: hosts lent as one machine kind differ by 2x.
    plain = plain_torch_host_us()
    result["plain_torch_host_us_per_kernel"] = plain
    for row in result["rows"]:
        row["host_per_kernel_over_plain_torch"] = row["host_us_per_kernel"] / plain
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
