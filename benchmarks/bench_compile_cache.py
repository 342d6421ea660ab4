"""The piecewise `compile` phase cold (dynamo traces, the entry is written) and warm (loaded
from the compile cache), each in a fresh process, as two captures of the same model would run.

Each child builds the model with random weights, then times what a capture's `compile`
phase times: building PiecewiseGraphRunner and its warm-up forward. The cache lives in a
fresh folder, so the first child always misses.

    python benchmarks/bench_compile_cache.py --model tiny --layers 32 --out benchmarks/.../compile-cache.json
    python benchmarks/bench_compile_cache.py --model llama-3.1-8b --device cuda --tokens 8192 --out ...
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(args: argparse.Namespace) -> dict:
    import dataclasses

    import torch

    from cgtool.attention import make_backend
    from cgtool.model.loader import build_model
    from cgtool.runners.compile_cache import default_cache_dir
    from cgtool.runners.piecewise import PiecewiseGraphRunner
    from cgtool.runtime.engine import ModelRunner
    from cgtool.runtime.kv import KVPool
    from cgtool.specs.config import load_model_config

    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    cfg = load_model_config(args.model)
    if args.layers:  # dynamo's time goes with the layers, not their width: a deep tiny model
        cfg = dataclasses.replace(cfg, num_layers=args.layers)
    context = max(args.tokens) + 1
    model = build_model(cfg, device=args.device, dtype=dtype, max_positions=context)
    pool = KVPool(cfg, 4 * context, max_reqs=8, max_context_len=context, dtype=dtype, device=args.device)
    backend = make_backend("torch" if args.device == "cpu" else "triton", cfg.num_heads, cfg.head_dim)
    runner = ModelRunner(model, pool, backend)
    start = time.perf_counter()
    piecewise = PiecewiseGraphRunner(runner, args.tokens, compile_cache_dir=default_cache_dir())
    built_s = time.perf_counter() - start
    piecewise.warmup()
    if args.device != "cpu":
        torch.cuda.synchronize()
    return {
        "torch": torch.__version__,
        "compile_cache": piecewise.compile_cache,
        "compile_s": time.perf_counter() - start,  # what the capture's compile phase times
        "runner_built_s": built_s,  # of it: key, load or torch.compile's wrapper
        "dynamo_imported": "torch._dynamo" in sys.modules,
        "not_stored_reason": piecewise.not_stored_reason,
    }


def run_child(argv: list[str], cache_dir: Path) -> dict:
    env = os.environ | {"CGTOOL_CACHE_DIR": str(cache_dir)}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--child", *argv], env=env, check=True,
                          capture_output=True, text=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_s"] = time.perf_counter() - start
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--layers", type=int, help="override the preset's layer count")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tokens", default="8,16,64", help="capture token counts (the largest is warmed up)")
    parser.add_argument("--rounds", type=int, default=3, help="cold/warm pairs, each with a fresh cache")
    parser.add_argument("--out")
    parser.add_argument("--child", action="store_true")
    args = parser.parse_args()
    args.tokens = sorted(int(t) for t in args.tokens.split(","))
    if args.child:
        print(json.dumps(child(args)))
        return
    argv = ["--model", args.model, "--device", args.device, "--tokens", ",".join(map(str, args.tokens))]
    if args.layers:
        argv += ["--layers", str(args.layers)]
    rounds = []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="cgtool-bench-compile-cache-") as cache_dir:
            cold = run_child(argv, Path(cache_dir))
            warm = run_child(argv, Path(cache_dir))
        rounds.append({"cold": cold, "warm": warm})
        print(f"cold ({cold['compile_cache']}) {cold['compile_s']:.2f} s, "
              f"warm ({warm['compile_cache']}) {warm['compile_s']:.2f} s; "
              f"processes {cold['process_s']:.1f} s / {warm['process_s']:.1f} s", flush=True)
    summary = {
        "date": datetime.date.today().isoformat(), "host": platform.node(), "model": args.model,
        "layers": args.layers, "device": args.device, "tokens": args.tokens, "python": platform.python_version(),
        "rounds": rounds,
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
