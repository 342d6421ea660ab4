"""Where a decode replay's time goes: the GPU's time per replay against the host's time to
issue one (its input copies, then the graph launch), in one process.

A lone replay is timed from before its input copies, so the host's issuing time is in it;
replays timed k to a batch overlap the next one's issuing with the GPU's work, and the
per-replay time falls toward the GPU's own. Issue 14 compares replay with the bandwidth
roofline. Usage: python benchmarks/bench_replay.py [--model llama-3.1-8b] [--bs 1,64] [--out F]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from functools import partial
from pathlib import Path

import torch

from cgtool.capture.timing import copy_bandwidth_bytes_s, host_launch_ms, timed_call
from cgtool.capture.workbench import build_workbench
from cgtool.runners.decode import DecodeGraphRunner
from cgtool.runners.pool import freeze_gc
from cgtool.specs.config import load_model_config


def per_call_ms(fn, calls: int, batches: int = 7) -> float:
    """Median over `batches` of one batch's time divided by its `calls`."""
    return statistics.median(timed_call(lambda: [fn() for _ in range(calls)])[1] / calls for _ in range(batches))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--bs", default="1,64")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--after-compile", action="store_true",
                        help="time again once dynamo has compiled the piecewise body in this process")
    parser.add_argument("--blas", help="e.g. cublas,cublaslt: one runner captured under each BLAS "
                        "library, replays compared in alternating rounds")
    parser.add_argument("--heat", type=float, default=0.0,
                        help="seconds of large GEMMs, then replay timed at once and after rests")
    parser.add_argument("--drift", action="store_true",
                        help="bs-1 replay of one graph before and after other work in the process: "
                             "idle time, allocating memory, capturing 36 more graphs, a piecewise capture")
    args = parser.parse_args()
    sizes = [int(s) for s in args.bs.split(",")]
    cfg = load_model_config(args.model)
    bench = build_workbench(cfg, weights_dir=None, dtype=torch.bfloat16, mem_fraction_static=0.85,
                            max_bs=max(sizes), max_tokens=2048 if args.drift else 16, context_len=1024, seed=0)
    runner = DecodeGraphRunner(bench.runner, sizes)
    runner.capture()
    bandwidth = copy_bandwidth_bytes_s()
    rows = _measure(bench, runner, sizes, bandwidth, "before compile")
    if args.blas:
        rows += _blas_rounds(bench, sizes, args.blas.split(","))
    if args.heat:
        rows += _after_heat(bench, runner, sizes[0], args.heat)
    if args.drift:
        rows += _drift(bench, runner, sizes[0])
    if args.after_compile:
        from cgtool.runners.piecewise import PiecewiseGraphRunner

        PiecewiseGraphRunner(bench.runner, capture_num_tokens=[4, 8, 16]).warmup()
        rows += _measure(bench, runner, sizes, bandwidth, "after dynamo compiled the body")
        rows += _with_progress_bar(partial(_measure, bench, runner, sizes, bandwidth,
                                           "after compile, a rich progress bar refreshing"))
    result = {"model": args.model, "device": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d"),
              "copy_bandwidth_bytes_s": bandwidth, "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


def _blas_rounds(bench, sizes: list[int], libraries: list[str], rounds: int = 4) -> list[dict]:
    runners = {}
    for library in libraries:
        torch.backends.cuda.preferred_blas_library(library)
        runners[library] = DecodeGraphRunner(bench.runner, sizes)
        runners[library].capture()
    torch.backends.cuda.preferred_blas_library("cublas")
    rows = []
    with freeze_gc(enable_cudagraph_gc=False, collect=False):
        for r in range(rounds):
            for library in libraries if r % 2 == 0 else reversed(libraries):
                for bs in sizes:
                    replay = partial(runners[library].replay_outputs, bench.decode_batch(bs))
                    row = {"when": f"blas round {r}", "blas": library, "bs": bs,
                           "replay_ms_4_a_batch": per_call_ms(replay, 4)}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    return rows


def _gpu_state() -> dict:
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    return {"temp_c": pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
            "sm_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "mem_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
            "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3}


def _after_heat(bench, runner: DecodeGraphRunner, bs: int, seconds: float) -> list[dict]:
    """Decode replay on a cool GPU, right after `seconds` of compute-bound GEMMs (as after
    piecewise's prefill measurements), then after rests: does the GPU's state move it?"""
    replay = partial(runner.replay_outputs, bench.decode_batch(bs))
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    rows = []

    def point(when: str) -> None:
        row = {"when": when, "bs": bs, "replay_ms_4_a_batch": per_call_ms(replay, 4), **_gpu_state()}
        rows.append(row)
        print(json.dumps(row), flush=True)

    point("before heat")
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()
    point(f"right after {seconds:g} s of GEMMs")
    for rest in (2, 5, 10):
        time.sleep(rest)
        point(f"after a further {rest} s rest")
    return rows


def _drift(bench, runner: DecodeGraphRunner, bs: int) -> list[dict]:
    """Issue 14: decode replay measured 3% slower in `--kind both` than decode-only. Which
    event in a process moves one captured graph's replay time?"""
    replay = partial(runner.replay_outputs, bench.decode_batch(bs))
    rows = []
    keep = []

    def point(when: str) -> None:
        times = [per_call_ms(replay, 4) for _ in range(3)]
        row = {"when": when, "bs": bs, "replay_ms_4_a_batch": statistics.median(times), "all": times,
               **_gpu_state()}
        rows.append(row)
        print(json.dumps(row), flush=True)

    point("drift: start")
    time.sleep(15)
    point("drift: after 15 s idle")
    blocks = [torch.empty(1 << 30, dtype=torch.uint8, device="cuda") for _ in range(8)]
    del blocks
    point("drift: after allocating and freeing 8 GiB")
    other = DecodeGraphRunner(bench.runner, list(range(8, 257, 8)) + [1, 2, 4])
    other.capture()
    keep.append(other)
    point("drift: after capturing 35 more decode graphs")
    from cgtool.runners.piecewise import PiecewiseGraphRunner

    piecewise = PiecewiseGraphRunner(bench.runner, capture_num_tokens=[512, 1024, 2048])
    piecewise.capture()
    keep.append(piecewise)
    point("drift: after a piecewise capture")
    end = time.perf_counter() + 10
    batch = bench.extend_batch(2048)
    while time.perf_counter() < end:
        piecewise.replay(batch)
        torch.cuda.synchronize()
    point("drift: after 10 s of piecewise replays at 2048 tokens")
    time.sleep(15)
    point("drift: after a further 15 s idle")
    return rows


def _with_progress_bar(measure) -> list[dict]:
    """As the capture command measures: a rich Progress, writing to a file, refreshing."""
    import io

    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(file=io.StringIO())) as progress:
        progress.add_task("measure", total=10)
        return measure()


def _measure(bench, runner: DecodeGraphRunner, sizes: list[int], bandwidth: float, when: str) -> list[dict]:
    rows = []
    with freeze_gc(enable_cudagraph_gc=False, collect=False):
        for bs in sizes:
            batch = bench.decode_batch(bs)
            replay = partial(runner.replay_outputs, batch)
            graph = runner.graphs[bs]
            kv_read = bs * (bench.context_len + 1) * bench.cfg.kv_bytes_per_token(2)
            roofline = (bench.weights_bytes + kv_read) / bandwidth * 1e3
            row = {"when": when, "bs": bs, "roofline_ms": roofline,
                   "host_replay_ms": host_launch_ms(replay, repeats=20),
                   "host_load_inputs_ms": host_launch_ms(partial(runner.load_inputs, batch), repeats=20),
                   "host_graph_launch_ms": host_launch_ms(graph.replay, repeats=20)}
            for calls in (1, 2, 4, 8):
                row[f"replay_ms_{calls}_a_batch"] = per_call_ms(replay, calls)
            row["graph_only_ms_8_a_batch"] = per_call_ms(graph.replay, 8)
            row["eager_ms_lone"] = statistics.median(
                timed_call(partial(runner.eager_outputs, batch))[1] for _ in range(7))
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


if __name__ == "__main__":
    main()
