"""Print the benchmark table from the capture reports that scripts/gpu-check.sh wrote."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from cgtool.units import GIB, MIB


def decode_lines(name: str, report: dict) -> list[str]:
    rows = _rows(report, "decode")
    if not rows:
        return []
    ok = [r for r in rows.values() if r["status"] == "ok"]
    one = rows.get(1)
    lines = [_heading(name, "decode", report)]
    bw = report["totals"].get("copy_bandwidth_bytes_s") or 0
    lines.append(f"copy bandwidth {bw / 1e12:.2f} TB/s; sizes {len(rows)}, verified ok {len(ok)}")
    lines.append(
        f"capture of all sizes {_sum(rows, 'capture_s'):.2f} s; "
        f"retained graph memory {_sum(rows, 'retained_bytes') / GIB:.3f} GiB"
    )
    if one and one["replay_ms"]:
        pct = 100 * one["roofline_ms"] / one["replay_ms"]
        lines.append(
            f"bs=1 eager {one['eager_ms']:.3f} ms, replay {one['replay_ms']:.3f} ms, "
            f"speedup {one['speedup']:.2f}x, roofline {one['roofline_ms']:.3f} ms ({pct:.0f}% of roofline)"
        )
    lines.append("bs  eager_ms  replay_ms  speedup  retained_MiB  capture_s")
    return lines + _size_lines(rows, 4, lambda r: (
        f"{_timings(r)}  {r['retained_bytes'] / MIB:>12.1f}  {r['capture_s']:>9.3f}"
    ))


def piecewise_lines(name: str, report: dict) -> list[str]:
    rows = _rows(report, "piecewise")
    if not rows:
        return []
    lines = [_heading(name, "piecewise", report)]
    lines.append(
        f"sizes {len(rows)}; capture {_sum(rows, 'capture_s'):.2f} s "
        f"(total session {report['totals']['capture_s']:.1f} s incl. compile); "
        f"retained {_sum(rows, 'retained_bytes') / GIB:.3f} GiB; "
        f"non-torch {_sum(rows, 'non_torch_bytes') / GIB:.3f} GiB"
    )
    lines.append("tokens  eager_ms  replay_ms  speedup  %roofline  retained_MiB")
    return lines + _size_lines(rows, 8, lambda r: (
        f"{_timings(r)}  {_roofline_pct(r):>8.0f}%  {r['retained_bytes'] / MIB:>12.1f}"
    ))


def _rows(report: dict, kind: str) -> dict[int, dict]:
    return {r["size"]: r for r in report["sizes"] if r["kind"] == kind}


def _heading(name: str, kind: str, report: dict) -> str:
    return f"## {name} {kind} ({report['environment']['gpu_name']}, {report['created'][:10]})"


def _sum(rows: dict[int, dict], field: str) -> float:
    return sum(r[field] for r in rows.values())


def _timings(r: dict) -> str:
    return f"{r['eager_ms']:>8.3f}  {r['replay_ms']:>9.3f}  {r['speedup']:>6.2f}x"


def _roofline_pct(r: dict) -> float:
    return 100 * r["roofline_ms"] / r["replay_ms"] if r["roofline_ms"] else float("nan")


def _size_lines(rows: dict[int, dict], width: int, cells: Callable[[dict], str]) -> list[str]:
    """One line a size, smallest first; a size with no replay shows its status instead."""
    return [
        f"{size:<{width}}{rows[size]['status'] if rows[size]['replay_ms'] is None else cells(rows[size])}"
        for size in sorted(rows)
    ]


def vit_lines(name: str, report: dict) -> list[str]:
    rows = {r["size"]: r for r in report["sizes"] if r["kind"] == "vit"}
    if not rows:
        return []
    sizes = report["settings"].get("image_sizes") or []
    lines = [f"## {name} vit ({report['environment']['gpu_name']}, {report['created'][:10]})",
             "images " + ", ".join(f"{h}x{w}" for h, w in sizes),
             (f"capture of all shapes {sum(r['capture_s'] for r in rows.values()):.2f} s; graph pool "
             f"{report['totals']['graph_pool_bytes'] / GIB:.3f} GiB"),
             "patches  eager_ms  replay_ms  speedup  %roofline  retained_MiB  peak_MiB  capture_s"]
    for n in sorted(rows):
        r = rows[n]
        if r["replay_ms"] is None:
            lines.append(f"{n:<9}{r['status']}")
            continue
        pct = 100 * r["roofline_ms"] / r["replay_ms"] if r["roofline_ms"] else float("nan")
        lines.append(
            f"{n:<9}{r['eager_ms']:>8.3f}  {r['replay_ms']:>9.3f}  {r['speedup']:>6.2f}x  {pct:>8.0f}%  "
            f"{r['retained_bytes'] / (1 << 20):>12.1f}  {r['peak_bytes'] / (1 << 20):>8.1f}  {r['capture_s']:>9.3f}"
        )
    return lines


def main() -> None:
    runs = Path(sys.argv[1])
    for report_path in sorted(runs.glob("*/report.json")):
        report = json.loads(report_path.read_text())
        name = report["model"]["name"]
        for line in decode_lines(name, report) + piecewise_lines(name, report) + vit_lines(name, report):
            print(line)
        print()
    for compile_json in sorted(runs.glob("compile-*.json")):
        summary = json.loads(compile_json.read_text())
        if "cgtool_capture_s" not in summary:  # another bench's file (compile-cache-bench.json)
            continue
        print(f"## torch.compile reduce-overhead vs cgtool, {summary['model']} ({summary['gpu']})")
        print(f"cgtool capture {summary['cgtool_capture_s']:.1f} s; torch.compile compile + record "
              f"{summary.get('compile_compile_and_capture_s', float('nan')):.1f} s")


if __name__ == "__main__":
    main()
