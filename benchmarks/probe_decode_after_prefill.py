"""Issue 33: does capturing prefill graphs first slow the decode graphs captured after them?

`cgtool capture --kind both` replayed deepseek-v2-lite's decode graphs 150-230 us slower than
`--kind decode` (H200, 2026-11-28), with the same kernels and the same summed kernel time: the
kernels' gaps grew, about 0.4 us each. `verify` captures prefill graphs before decode graphs, as a
server does. This captures decode graphs at each stage of what a prefill capture does, in one
process, and replays every set captured so far after each stage, on the default stream and on
a stream of its own (`NAME@side`):

- `first`: decode graphs captured before anything else;
- `after_eager_N`: after one eager extend forward of N tokens, for each N of `--eager-tokens` in
  turn (the prefill runner's warm-up runs one at its largest size); only `first` is replayed;
- `after_prefill`: after the prefill runner (`--prefill-backend`) captured `--tokens`.

With `--captures` it instead replays `first` after each capture named there, in turn:
`same_stream` (another decode set recorded on `first`'s capture stream), `tiny_same` and
`tiny_new` (a graph of one small kernel, by `torch.cuda.graph`, on `first`'s stream or a new one),
`tiny_kept` (the same through cgtool's `record_graph`, on `first`'s stream), `new_stream` (another
decode set on a stream of its own, as every runner makes), `empty_cache` (no capture: the
allocator's cache released, as `torch.cuda.graph` does first), `new_segment` (no capture: 1 GiB
allocated and kept), `upload` (no capture: each of `first`'s graphs uploaded again on its stream by
the driver's `cuGraphUpload`), `tiny_reset` (`tiny_new`, its graph destroyed at once), `one_size`
(only the smallest decode size recorded again on `first`'s stream), `other_bs` (a decode size that
`first` lacks, on `first`'s stream), `second` (the decode sizes recorded on a new stream, and timed
from then on beside `first`), `second_one` (the smallest size recorded again on `second`'s
stream), `eager_same` and `eager_default` (no capture: one eager decode forward at the smallest
size on `first`'s stream, or on the default stream), `eager_extend` (no capture: one eager
512-token extend on the default stream), `prefill` (breakable prefill graphs captured at 512
tokens, as `verify` holds them) and `prefill_step` (one 512-token extend through them, as a
server's prefill step runs).

    python3 benchmarks/probe_decode_after_prefill.py --out gap.json [--bs 1,8] [--tokens 512]
        [--prefill-backend breakable] [--eager-tokens 4096,512] [--captures tiny_same,new_stream]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time

import bench_moe_mla as timing
import torch

from cgtool.capture.prefill_backend import prefill_runner
from cgtool.capture.workbench import build_workbench
from cgtool.runners.decode import DecodeGraphRunner
from cgtool.runners.graphs import record_graph
from cgtool.runners.pool import get_global_graph_memory_pool
from cgtool.specs.config import load_model_config

ROUNDS, REPLAYS = 5, 20
SIDE_STREAM = torch.cuda.Stream() if torch.cuda.is_available() else None


def replay_and_launch_ms(graph: torch.cuda.CUDAGraph) -> tuple[float, float]:
    """(GPU ms, host ms) of one replay, over REPLAYS back to back: the host's is how long
    `replay()` took to return, which shows when launching the graph outruns running it."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    host = time.perf_counter()
    for _ in range(REPLAYS):
        graph.replay()
    host = time.perf_counter() - host
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / REPLAYS, host * 1e3 / REPLAYS


def clocks_under_load(graph: torch.cuda.CUDAGraph, replays: int = 200, samples: int = 20) -> dict[str, float]:
    """The GPU's SM and memory clocks (MHz), power (W) and throttle-reason bits, read by NVML
    while `replays` replays queued at once run: a front end clocked lower would space a graph's
    kernels further apart and leave memory-bound kernels' times nearly as they were."""
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    torch.cuda.synchronize()
    for _ in range(replays):
        graph.replay()
    sm, mem, power, reasons = [], [], [], 0
    for _ in range(samples):
        time.sleep(0.01)
        sm.append(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
        mem.append(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM))
        power.append(pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3)
        reasons |= pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)
    torch.cuda.synchronize()
    return {"sm_mhz": statistics.median(sm), "sm_mhz_min": min(sm), "mem_mhz": statistics.median(mem),
            "power_w": statistics.median(power), "throttle_reasons": reasons}


def replay_ms(runners: dict[str, DecodeGraphRunner], batches: dict[int, object]) -> dict[str, dict]:
    """Every set's replay ms (GPU, and the host's launch) at every size, medians of alternating rounds."""
    found: dict[str, dict[int, list]] = {}
    for _ in range(ROUNDS):
        for name, runner in runners.items():
            for bs, batch in batches.items():
                runner.load_inputs(batch)
                found.setdefault(name, {}).setdefault(bs, []).append(replay_and_launch_ms(runner.graphs[bs]))
                with torch.cuda.stream(SIDE_STREAM):  # a non-blocking stream, not the default one
                    found.setdefault(f"{name}@side", {}).setdefault(bs, []).append(
                        replay_and_launch_ms(runner.graphs[bs]))
    return {name: {bs: [statistics.median(g for g, _ in v), statistics.median(h for _, h in v)]
                   for bs, v in sizes.items()} for name, sizes in found.items()}


def upload_again(runner: DecodeGraphRunner) -> None:
    """Each of the runner's graphs uploaded to the device again, on its capture stream, by the
    driver's API (torch has no call for it)."""
    driver = ctypes.CDLL("libcuda.so.1")
    for graph in runner.graphs.values():
        rc = driver.cuGraphUpload(ctypes.c_void_p(graph.raw_cuda_graph_exec()),
                                  ctypes.c_void_p(runner.stream.cuda_stream))
        if rc != 0:
            raise RuntimeError(f"cuGraphUpload returned {rc}")
    torch.cuda.synchronize()


def write_dot(graph: torch.cuda.CUDAGraph, path: str) -> None:
    """The graph as the driver's DOT dump (cuGraphDebugDotPrint, verbose): every node's kernel
    and every edge with its type, programmatic dependent launches included."""
    driver = ctypes.CDLL("libcuda.so.1")
    rc = driver.cuGraphDebugDotPrint(ctypes.c_void_p(graph.raw_cuda_graph()), path.encode(), ctypes.c_uint(1))
    if rc != 0:
        raise RuntimeError(f"cuGraphDebugDotPrint returned {rc}")


_kept: list[object] = []  # what the extra captures made, alive to the end as a server's graphs are


def run_without_capture(kind: str, first: DecodeGraphRunner, bench: object, sizes: list[int]) -> bool:
    """The events that record no graph (see the module's doc); False for any other kind."""
    if kind == "upload":
        upload_again(first)
    elif kind in ("eager_same", "eager_default"):
        with torch.cuda.stream(first.stream if kind == "eager_same" else torch.cuda.default_stream()):
            bench.runner.forward_eager(bench.decode_batch(sizes[0]))
    elif kind == "eager_extend":
        bench.runner.forward_eager(bench.extend_batch(512))
    elif kind == "prefill_step":
        next(k for k in reversed(_kept) if hasattr(k, "can_run")).forward(bench.extend_batch(512))
    elif kind == "empty_cache":
        torch.cuda.empty_cache()
    elif kind == "new_segment":
        _kept.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))
    else:
        return False
    torch.cuda.synchronize()
    return True


def capture_tiny(kind: str, stream: torch.cuda.Stream) -> None:
    """A graph of one small kernel: through cgtool's record_graph (`tiny_kept`) or
    torch.cuda.graph, kept to the end or destroyed at once (`tiny_reset`)."""
    x = torch.zeros(1024, device="cuda")
    if kind == "tiny_kept":
        _kept.append((x, record_graph(lambda: x.add_(1), stream)))
        return
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=get_global_graph_memory_pool(), stream=stream):
        x.add_(1)
    if kind == "tiny_reset":
        graph.reset()
    else:
        _kept.append((x, graph))


def capture_another(kind: str, runners: dict[str, DecodeGraphRunner], bench: object, sizes: list[int]) -> None:
    """One more event of `kind` (see the module's doc): a capture into the global pool, or one
    of run_without_capture's."""
    first = runners["first"]
    if run_without_capture(kind, first, bench, sizes):
        return
    same = ("same_stream", "tiny_same", "tiny_kept", "one_size", "other_bs")
    stream = first.stream if kind in same else runners["second"].stream if kind == "second_one" else torch.cuda.Stream()
    if kind.startswith("tiny"):
        capture_tiny(kind, stream)
        return
    if kind == "prefill":
        prefill = prefill_runner("breakable", bench.runner, [512])
        prefill.warmup()
        prefill.capture()
        _kept.append(prefill)
        torch.cuda.synchronize()
        return
    if kind in ("one_size", "second_one"):
        sizes = sizes[:1]
    elif kind == "other_bs":
        sizes = [min(set(range(1, sizes[-1] + 1)) - set(sizes))]
    runner = DecodeGraphRunner(bench.runner, sizes)
    runner.stream = stream
    runner.capture()
    if kind == "second":
        runners["second"] = runner
    else:
        _kept.append(runner)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", default="deepseek-v2-lite")
    parser.add_argument("--bs", default="1,8")
    parser.add_argument("--tokens", default="512")
    parser.add_argument("--eager-tokens", default="4096,512")
    parser.add_argument("--captures", help="captures to make after `first`, in turn (see above)")
    parser.add_argument("--dot", help="write the first set's smallest graph here as the driver's DOT dump")
    parser.add_argument("--clocks", action="store_true",
                        help="after each stage, the GPU's clocks read while the first set's largest size replays")
    parser.add_argument("--prefill-backend", default="breakable", choices=("breakable", "piecewise"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("probe_decode_after_prefill.py needs a GPU")
    sizes = sorted(int(v) for v in args.bs.split(","))
    tokens = sorted(int(v) for v in args.tokens.split(","))
    eager_tokens = [int(v) for v in args.eager_tokens.split(",")]
    cfg = load_model_config(args.model)
    bench = build_workbench(cfg, weights_dir=None, dtype=torch.bfloat16, mem_fraction_static=0.85,
                            max_bs=sizes[-1], max_tokens=max(tokens + eager_tokens), context_len=1024, seed=0)
    batches = {bs: bench.decode_batch(bs) for bs in sizes}
    runners: dict[str, DecodeGraphRunner] = {}
    stages: dict[str, dict] = {}
    clocks: dict[str, dict] = {}  # --clocks: by stage

    def capture_and_time(name: str, capture: bool = True) -> None:
        if capture:
            runners[name] = DecodeGraphRunner(bench.runner, sizes)
            runners[name].capture()
        stages[name] = replay_ms(runners, batches)
        timing.log(f"after {name}: " + "; ".join(
            f"{set_name} " + " ".join(f"bs {bs} {gpu:.3f} (host {host:.3f})" for bs, (gpu, host) in found.items())
            for set_name, found in stages[name].items()))
        if args.clocks:
            biggest = max(batches)
            runners["first"].load_inputs(batches[biggest])
            clocks[name] = clocks_under_load(runners["first"].graphs[biggest])
            timing.log(f"after {name}: clocks {clocks[name]}")

    capture_and_time("first")
    if args.dot:
        write_dot(runners["first"].graphs[sizes[0]], args.dot)
    if args.captures:
        for i, kind in enumerate(args.captures.split(",")):
            capture_another(kind, runners, bench, sizes)
            capture_and_time(f"{i + 1}:{kind}", capture=False)  # a kind may come more than once
        timing.save_results({"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                             "torch": torch.__version__, "model": args.model, "captures": args.captures,
                             "rounds": ROUNDS, "replays": REPLAYS, "stages": stages, "clocks": clocks}, args.out)
        return
    for n in eager_tokens:
        bench.runner.forward_eager(bench.extend_batch(n))
        torch.cuda.synchronize()
        capture_and_time(f"after_eager_{n}", capture=False)
    prefill = prefill_runner(args.prefill_backend, bench.runner, tokens)
    prefill.warmup()
    prefill.capture()
    torch.cuda.synchronize()
    capture_and_time("after_prefill")
    timing.save_results({"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                         "torch": torch.__version__, "model": args.model, "tokens": tokens, "eager_tokens": eager_tokens,
                         "prefill_backend": args.prefill_backend, "rounds": ROUNDS, "replays": REPLAYS,
                         "stages": stages, "clocks": clocks}, args.out)


if __name__ == "__main__":
    main()
