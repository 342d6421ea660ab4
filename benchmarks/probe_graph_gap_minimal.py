"""Issue 33: does plain PyTorch show the graph gap, with no cgtool kernel, runner or pool?

cgtool's decode graphs replay 0.31-0.45 us a kernel slower once another graph is captured in the
process (benchmarks/results/h200-2026-11-28-graph-gaps). This records a chain of `--kernels`
plain torch kernels (cuBLAS GEMVs of a decode-sized linear layer and elementwise ops, alternating)
as one graph, times its replay, then after each event of `--events` in turn:

- `tiny`: a graph of one small kernel captured on a new stream;
- `eager`: the chain run once eagerly;
- `again`: the chain recorded again on the first graph's stream (its replay timed is the first's);
- `second`: the chain recorded again on a new stream, kept as the second graph;
- `replay2`: the second graph replayed once, as a server replays its prefill graphs between
  decode steps.

The elementwise op (`--op`) is torch's SiLU, or a Triton kernel doing the same, launched by
Triton's own `kernel[grid]` (`triton`), or as a programmatic dependent launch that waits for the
product and releases the next kernel at once (`triton_pdl`), as cgtool's kernels may.

    python3 benchmarks/probe_graph_gap_minimal.py --out gap.json [--kernels 600] [--events tiny,eager,tiny]
        [--op torch|triton|triton_pdl]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import bench_moe_mla as timing
import torch
import triton
import triton.language as tl

ROUNDS, REPLAYS = 5, 20


@triton.jit
def _silu_kernel(X, n, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n).to(tl.float32)
    tl.store(X + offs, (x / (1 + tl.exp(-x))).to(X.dtype.element_ty), mask=offs < n)


def _silu(op: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if op == "torch":
        return torch.nn.functional.silu

    def silu(h: torch.Tensor) -> torch.Tensor:
        pdl = op == "triton_pdl"
        _silu_kernel[(triton.cdiv(h.numel(), 1024),)](h, h.numel(), BLOCK=1024, PDL=pdl,
                                                      **({"launch_pdl": True} if pdl else {}))
        return h
    return silu


def chain(kernels: int, width: int, op: str = "torch") -> tuple[Callable[[], None], list]:
    """A forward of `kernels` // 2 layers: a [1, width] x [width, width] product (cuBLAS may split
    its K and add a reduce kernel), then an elementwise op on its output, each layer with its
    own weights."""
    x = torch.randn(1, width, device="cuda", dtype=torch.bfloat16)
    weights = [torch.randn(width, width, device="cuda", dtype=torch.bfloat16) / width**0.5
               for _ in range(kernels // 2)]
    silu = _silu(op)

    def forward() -> None:
        h = x
        for w in weights:
            h = silu(h @ w)
        out.copy_(h)
    out = torch.empty_like(x)
    return forward, [x, out, weights]


def replay_ms(graph: torch.cuda.CUDAGraph) -> float:
    """The median over ROUNDS of one replay's ms, REPLAYS back to back a round."""
    rounds = []
    for _ in range(ROUNDS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(REPLAYS):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        rounds.append(start.elapsed_time(end) / REPLAYS)
    return statistics.median(rounds)


def record(forward: Callable[[], None], stream: torch.cuda.Stream) -> torch.cuda.CUDAGraph:
    with torch.cuda.stream(stream):
        forward()
        forward()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        forward()
    return graph


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--kernels", type=int, default=600)
    parser.add_argument("--width", type=int, default=2048, help="the linear layers' width (bf16)")
    parser.add_argument("--events", default="tiny,eager,tiny,again,tiny")
    parser.add_argument("--op", default="torch", choices=("torch", "triton", "triton_pdl"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("probe_graph_gap_minimal.py needs a GPU")
    forward, _inputs = chain(args.kernels, args.width, args.op)
    stream = torch.cuda.Stream()
    first = record(forward, stream)
    kept: list[object] = []
    second = None
    stages = [("first", replay_ms(first))]
    timing.log(f"{args.op} first: {stages[-1][1]:.4f} ms ({args.kernels} kernels)")
    for i, event in enumerate(args.events.split(",")):
        if event == "tiny":
            y = torch.zeros(1024, device="cuda")
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
                y.add_(1)
            kept.append((y, graph))
        elif event == "eager":
            forward()
            torch.cuda.synchronize()
        elif event == "again":
            kept.append(record(forward, stream))
        elif event == "second":
            second = record(forward, torch.cuda.Stream())
        elif event == "replay2":
            second.replay()
            torch.cuda.synchronize()
        else:
            sys.exit(f"unknown event {event!r}")
        stages.append((f"{i + 1}:{event}", replay_ms(first)))
        layers = args.kernels // 2  # a product (two kernels where cuBLAS splits K) and an op each
        timing.log(f"{stages[-1][0]}: {stages[-1][1]:.4f} ms ({(stages[-1][1] - stages[0][1]) * 1e3 / layers:+.3f} us a layer)")
    timing.save_results({"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                         "torch": torch.__version__, "kernels": args.kernels, "width": args.width, "op": args.op,
                         "rounds": ROUNDS, "replays": REPLAYS, "stages": dict(stages)}, args.out)


if __name__ == "__main__":
    main()
