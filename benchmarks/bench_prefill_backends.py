"""Breakable prefill graphs beside torch.compile pieces (issue 38), on the GPU.

For each model, `cgtool capture --kind piecewise` runs twice over the same token counts, once
per --prefill-backend, without the compile cache (so the piecewise run pays its compile). Each
report.json is kept as <model>-<backend>.json and one summary.json sets the two side by side:
compile (or warm-up) seconds, capture seconds, graph pool, and per size capture time, graph
memory, eager and replay time and the replay's difference from eager.

Usage: python3 benchmarks/bench_prefill_backends.py --out DIR [--models a,b] [--tokens 256,1024,4096]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

BACKENDS = ("piecewise", "breakable")


def run_one(model: str, backend: str, tokens: str, out: Path, timeout_s: int) -> dict:
    folder = out / f"{model}-{backend}"
    cmd = [sys.executable, "-m", "cgtool.commands.entry", "capture", "--model", model, "--kind", "piecewise",
           "--tokens", tokens, "--prefill-backend", backend, "--no-compile-cache", "--out", str(folder)]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
        rc, tail = proc.returncode, (proc.stdout + proc.stderr)[-3000:]
    except subprocess.TimeoutExpired:
        rc, tail = 124, f"timed out after {timeout_s} s"
    wall_s = round(time.perf_counter() - start, 1)
    print(f"[{time.strftime('%H:%M:%S')}] {model} {backend}: exit {rc} in {wall_s} s", flush=True)
    report_path = folder / "report.json"
    if not report_path.is_file():
        print(tail, flush=True)
        return {"model": model, "backend": backend, "exit": rc, "wall_s": wall_s, "error": tail}
    kept = out / f"{model}-{backend}.json"
    shutil.copy(report_path, kept)
    shutil.rmtree(folder, ignore_errors=True)  # figures and HTML stay out of the results
    return summarise(json.loads(kept.read_text()), model, backend, rc, wall_s)


def summarise(report: dict, model: str, backend: str, rc: int, wall_s: float) -> dict:
    totals = report["totals"]
    return {
        "model": model, "backend": backend, "exit": rc, "wall_s": wall_s,
        "settings_prefill_backend": report["settings"].get("prefill_backend"),
        "phase_s": totals["phase_s"],
        "graph_pool_bytes": totals["graph_pool_bytes"],
        "sizes": [
            {k: row.get(k) for k in ("size", "status", "capture_s", "retained_bytes", "non_torch_bytes",
                                     "peak_bytes", "eager_ms", "replay_ms", "speedup", "max_abs_diff",
                                     "kernels_per_forward")}
            for row in sorted(report["sizes"], key=lambda r: r["size"])
        ],
    }


def table(rows: list[dict]) -> str:
    lines = ["| model | backend | compile or warm-up s | capture s | graph pool MiB | size | capture s | "
             "retained MiB | eager ms | replay ms | max abs diff |", "|" + "---|" * 11]
    for r in rows:
        if "sizes" not in r:
            lines.append(f"| {r['model']} | {r['backend']} | failed (exit {r['exit']}) |" + " |" * 8)
            continue
        phases = r["phase_s"]
        first = phases.get("compile", phases.get("warmup", 0.0))
        for s in r["sizes"]:
            lines.append(
                f"| {r['model']} | {r['backend']} | {first:.2f} | {phases.get('capture', 0.0):.2f} | "
                f"{r['graph_pool_bytes'] / 2**20:.1f} | {s['size']} | {s['capture_s']:.3f} | "
                f"{s['retained_bytes'] / 2**20:.1f} | {s['eager_ms']} | {s['replay_ms']} | {s['max_abs_diff']} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", default="llama-3.1-8b,qwen3-30b-a3b")
    parser.add_argument("--tokens", default="256,1024,4096")
    parser.add_argument("--timeout-s", type=int, default=100)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for model in args.models.split(","):
        for backend in BACKENDS:
            rows.append(run_one(model, backend, args.tokens, args.out, args.timeout_s))
            # Written after each session, so a stage cut short keeps what it measured.
            (args.out / "summary.json").write_text(json.dumps(rows, indent=1))
    print(table(rows), flush=True)


if __name__ == "__main__":
    main()
