"""Kernels of one replayed forward by family and batch size, from `cgtool capture --profile` traces.

Issue 33 left deepseek-v2-lite's decode steps 3-10% slower than predicted at bs 2-22, and its
capture reports counting 807 kernels a forward at bs 8 and 16 against 675 at bs 1 and 754 from
bs 33, more than the cost model's accounting moves. This reads the Chrome trace each profiled
size wrote (`trace_decode_N.json`) and lists every kernel family's launches and GPU time, so the
kernels that come and go with the batch size, and what they cost, can be named.

    python benchmarks/kernel_census.py CAPTURE_DIR [CAPTURE_DIR...] --out census.json [--md census.md]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

_TRACE = re.compile(r"trace_decode_(\d+)\.json$")
_MEMORY_OPS = ("Memcpy", "Memset", "cudaMemcpy", "cudaMemset")


def family(name: str) -> str:
    """A kernel's name without its template arguments and parameters (cuBLAS/CUTLASS names keep
    their tile words, which say which GEMM variant ran)."""
    name = name.removeprefix("void ")
    for cut in ("<", "("):
        if cut in name:
            name = name.split(cut, 1)[0]
    return name.strip()[:90]


def trace_kernels(path: Path) -> list[tuple[str, float]]:
    """(name, GPU µs) of every kernel in a Chrome trace, in start order."""
    events = json.loads(path.read_text()).get("traceEvents", [])
    kernels = [
        e for e in events
        if e.get("ph") == "X" and str(e.get("cat", "")).lower() == "kernel"
        and not str(e.get("name", "")).startswith(_MEMORY_OPS)
    ]
    kernels.sort(key=lambda e: float(e.get("ts", 0.0)))
    return [(str(e["name"]), float(e.get("dur", 0.0))) for e in kernels]


def census(folder: Path) -> dict:
    """{"model", "sizes": {bs: {"kernels", "gpu_us", "families": {family: [launches, µs]}}}}."""
    report = json.loads((folder / "report.json").read_text())
    sizes: dict[int, dict] = {}
    for path in sorted(folder.glob("trace_decode_*.json")):
        match = _TRACE.search(path.name)
        if not match:
            continue
        families: dict[str, list[float]] = {}
        kernels = trace_kernels(path)
        for name, us in kernels:
            entry = families.setdefault(family(name), [0, 0.0])
            entry[0] += 1
            entry[1] += us
        sizes[int(match.group(1))] = {
            "kernels": len(kernels),
            "gpu_us": sum(us for _, us in kernels),
            "families": {k: [int(n), round(us, 2)] for k, (n, us) in sorted(families.items())},
        }
    replay = {s["size"]: s for s in report.get("sizes", []) if s.get("kind") == "decode"}
    for bs, row in sizes.items():
        measured = replay.get(bs, {})
        row["replay_ms"] = measured.get("replay_ms")
        row["report_kernels_per_forward"] = measured.get("kernels_per_forward")
    return {
        "model": report["model"]["name"],
        "gpu": report.get("environment", {}).get("gpu_name"),
        "context_len": report.get("settings", {}).get("context_len"),
        "sizes": dict(sorted(sizes.items())),
    }


def markdown(result: dict) -> str:
    """Families whose launches a forward change across the sizes, then the totals."""
    sizes = list(result["sizes"])
    rows = result["sizes"]
    names = sorted({f for row in rows.values() for f in row["families"]})
    lines = [f"## {result['model']} on {result['gpu']} (context {result['context_len']})", "",
             "| family | " + " | ".join(f"bs {bs}" for bs in sizes) + " |",
             "| --- |" + " ---: |" * len(sizes)]
    for name in names:
        cells = [rows[bs]["families"].get(name, [0, 0.0]) for bs in sizes]
        if len({n for n, _ in cells}) == 1 and cells[0][0] > 0 and len(sizes) > 1:
            continue  # the same launches at every size: not what moves
        lines.append(f"| `{name}` | " + " | ".join(f"{n} ({us:.0f} us)" for n, us in cells) + " |")
    lines.append("| **all kernels** | " + " | ".join(
        f"{rows[bs]['kernels']} ({rows[bs]['gpu_us']:.0f} us)" for bs in sizes) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--md", type=Path)
    args = parser.parse_args()
    results = [census(folder) for folder in args.folders]
    args.out.write_text(json.dumps(results, indent=1))
    if args.md:
        args.md.write_text("\n".join(markdown(r) for r in results))


if __name__ == "__main__":
    main()
