"""Decode: cgtool's graphs against torch.compile(mode="reduce-overhead") on the same sizes.

Both run the same model, KV pool and Triton attention with the same static batch buffers;
torch.compile compiles once with a dynamic batch dimension and records a CUDA graph per size.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from cgtool.capture.timing import median_cuda_ms
from cgtool.capture.workbench import build_workbench
from cgtool.planner.schedules import default_schedule
from cgtool.runners.decode import DecodeGraphRunner
from cgtool.runtime.batch import forward_context
from cgtool.specs.config import load_model_config


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--max-bs", type=int, default=256)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    sizes = list(default_schedule("sglang", max_bs=args.max_bs).decode_bs)
    cfg = load_model_config(args.model)
    bench = build_workbench(cfg, weights_dir=None, dtype=torch.bfloat16, mem_fraction_static=0.85,
                            max_bs=max(sizes), max_tokens=16, context_len=1024, seed=0)
    model, pool, backend = bench.runner.model, bench.runner.kv_pool, bench.runner.backend
    ours = DecodeGraphRunner(bench.runner, sizes)
    start = time.perf_counter()
    ours.capture()
    ours_capture_s = time.perf_counter() - start

    def step(input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return model.compute_logits(model(input_ids, positions))

    rows = []
    for bs in sizes:
        batch = bench.decode_batch(bs)
        rows.append({"bs": bs, "cgtool_replay_ms": median_cuda_ms(lambda: ours.replay(batch))})
    summary = {"model": args.model, "gpu": torch.cuda.get_device_name(0), "sizes": len(sizes),
               "cgtool_capture_s": ours_capture_s, "rows": rows}
    with open(args.out, "w") as f:  # ours is kept even if the torch.compile side fails
        json.dump(summary, f, indent=1)

    # torch.compile side: its own static buffers, never interleaved with our graphs.
    inputs = DecodeGraphRunner(bench.runner, sizes)
    compiled = torch.compile(step, mode="reduce-overhead", dynamic=True)
    compile_capture_s = 0.0
    for row in sorted(rows, key=lambda r: -r["bs"]):
        bs = row["bs"]
        inputs.load_inputs(bench.decode_batch(bs))
        static = inputs.static_batch(bs)

        def run_compiled() -> torch.Tensor:
            with forward_context(static, pool, backend):
                return compiled(static.input_ids, static.positions)

        t0 = time.perf_counter()
        run_compiled()
        run_compiled()  # cudagraph trees record on the second call of a shape
        torch.cuda.synchronize()
        row["compile_first_calls_s"] = time.perf_counter() - t0
        compile_capture_s += row["compile_first_calls_s"]
        row["compile_replay_ms"] = median_cuda_ms(run_compiled)
    summary["compile_compile_and_capture_s"] = compile_capture_s
    print(f"{'bs':>4} {'cgtool ms':>10} {'compile ms':>11} {'ratio':>6}")
    for r in sorted(rows, key=lambda r: r["bs"]):
        ratio = r["compile_replay_ms"] / r["cgtool_replay_ms"]
        print(f"{r['bs']:>4} {r['cgtool_replay_ms']:>10.3f} {r['compile_replay_ms']:>11.3f} {ratio:>6.2f}")
    print(f"capture of {len(sizes)} sizes: cgtool {ours_capture_s:.1f} s, "
          f"torch.compile reduce-overhead (compile + record) {compile_capture_s:.1f} s")
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
