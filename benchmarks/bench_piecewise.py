"""Prefill: eager vs piecewise replay vs one whole-forward CUDA graph, per token count.

The whole-forward graph (attention inside it, shapes fixed) is the ideal that splitting at
attention gives up for flexibility; piecewise replay should come close to it.
"""

from __future__ import annotations

import argparse
import json

import torch

from cgtool.capture.timing import median_cuda_ms
from cgtool.capture.workbench import build_workbench
from cgtool.runners.piecewise import PiecewiseGraphRunner
from cgtool.runners.pool import get_global_graph_memory_pool
from cgtool.specs.config import load_model_config


def whole_graph_ms(bench, batch) -> float:
    from cgtool.runtime.batch import forward_context

    runner = bench.runner
    stream = torch.cuda.Stream()

    def body() -> torch.Tensor:
        with forward_context(batch, runner.kv_pool, runner.backend):
            return runner.model.compute_logits(runner.model(batch.input_ids, batch.positions)[-1:])

    with torch.cuda.stream(stream):
        body()
        body()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=get_global_graph_memory_pool(), stream=stream):
        body()
    ms = median_cuda_ms(graph.replay)
    bench.graphs.append(graph)  # freeing a graph of the shared pool mid-run is unsafe
    return ms


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen2.5-0.5b")
    parser.add_argument("--tokens", default="64,128,256,512,2048")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    sizes = [int(t) for t in args.tokens.split(",")]
    cfg = load_model_config(args.model)
    bench = build_workbench(cfg, weights_dir=None, dtype=torch.bfloat16, mem_fraction_static=0.85,
                            max_bs=1, max_tokens=max(sizes), context_len=16, seed=0)
    bench.graphs = []
    model = bench.runner.model
    runner = PiecewiseGraphRunner(bench.runner, sizes)
    runner.warmup()
    runner.capture()
    rows = []
    for n in sizes:
        batch = bench.extend_batch(n)
        rows.append({
            "tokens": n,
            "eager_ms": median_cuda_ms(lambda: model.compute_logits(bench.runner.forward_eager(batch)[-1:])),
            "piecewise_ms": median_cuda_ms(lambda: model.compute_logits(runner.replay(batch)[-1:])),
            "whole_graph_ms": whole_graph_ms(bench, batch),
        })
    print(f"{args.model} on {torch.cuda.get_device_name(0)}")
    print(f"{'tokens':>6} {'eager':>9} {'piecewise':>10} {'whole graph':>12} {'pw/eager':>9} {'pw/whole':>9}")
    for r in rows:
        print(f"{r['tokens']:>6} {r['eager_ms']:>9.3f} {r['piecewise_ms']:>10.3f} {r['whole_graph_ms']:>12.3f} "
              f"{r['eager_ms'] / r['piecewise_ms']:>8.2f}x {r['piecewise_ms'] / r['whole_graph_ms']:>8.2f}x")
    with open(args.out, "w") as f:
        json.dump({"model": args.model, "gpu": torch.cuda.get_device_name(0), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
