"""Print the benchmark table from the capture reports that scripts/gpu-check.sh wrote."""

from __future__ import annotations

import json
import sys
from pathlib import Path

GIB = 1 << 30


def decode_lines(name: str, report: dict) -> list[str]:
    rows = {r["size"]: r for r in report["sizes"] if r["kind"] == "decode"}
    if not rows:
        return []
    ok = [r for r in rows.values() if r["status"] == "ok"]
    one = rows.get(1)
    lines = [f"## {name} decode ({report['environment']['gpu_name']}, {report['created'][:10]})"]
    bw = report["totals"].get("copy_bandwidth_bytes_s") or 0
    lines.append(f"copy bandwidth {bw / 1e12:.2f} TB/s; sizes {len(rows)}, verified ok {len(ok)}")
    capture_s = sum(r["capture_s"] for r in rows.values())
    retained = sum(r["retained_bytes"] for r in rows.values())
    lines.append(f"capture of all sizes {capture_s:.2f} s; retained graph memory {retained / GIB:.3f} GiB")
    if one and one["replay_ms"]:
        pct = 100 * one["roofline_ms"] / one["replay_ms"]
        lines.append(
            f"bs=1 eager {one['eager_ms']:.3f} ms, replay {one['replay_ms']:.3f} ms, "
            f"speedup {one['speedup']:.2f}x, roofline {one['roofline_ms']:.3f} ms ({pct:.0f}% of roofline)"
        )
    lines.append("bs  eager_ms  replay_ms  speedup  retained_MiB  capture_s")
    for bs in sorted(rows):
        r = rows[bs]
        if r["replay_ms"] is None:
            lines.append(f"{bs:<4}{r['status']}")
            continue
        lines.append(
            f"{bs:<4}{r['eager_ms']:>8.3f}  {r['replay_ms']:>9.3f}  {r['speedup']:>6.2f}x  "
            f"{r['retained_bytes'] / (1 << 20):>12.1f}  {r['capture_s']:>9.3f}"
        )
    return lines


def piecewise_lines(name: str, report: dict) -> list[str]:
    rows = {r["size"]: r for r in report["sizes"] if r["kind"] == "piecewise"}
    if not rows:
        return []
    lines = [f"## {name} piecewise ({report['environment']['gpu_name']}, {report['created'][:10]})"]
    capture_s = sum(r["capture_s"] for r in rows.values())
    retained = sum(r["retained_bytes"] for r in rows.values())
    non_torch = sum(r["non_torch_bytes"] for r in rows.values())
    lines.append(
        f"sizes {len(rows)}; capture {capture_s:.2f} s (total session {report['totals']['capture_s']:.1f} s "
        f"incl. compile); retained {retained / GIB:.3f} GiB; non-torch {non_torch / GIB:.3f} GiB"
    )
    lines.append("tokens  eager_ms  replay_ms  speedup  %roofline  retained_MiB")
    for n in sorted(rows):
        r = rows[n]
        if r["replay_ms"] is None:
            lines.append(f"{n:<8}{r['status']}")
            continue
        pct = 100 * r["roofline_ms"] / r["replay_ms"] if r["roofline_ms"] else float("nan")
        lines.append(
            f"{n:<8}{r['eager_ms']:>8.3f}  {r['replay_ms']:>9.3f}  {r['speedup']:>6.2f}x  "
            f"{pct:>8.0f}%  {r['retained_bytes'] / (1 << 20):>12.1f}"
        )
    return lines


def main() -> None:
    runs = Path(sys.argv[1])
    for report_path in sorted(runs.glob("*/report.json")):
        report = json.loads(report_path.read_text())
        name = report["model"]["name"]
        for line in decode_lines(name, report) + piecewise_lines(name, report):
            print(line)
        print()
    for compile_json in sorted(runs.glob("compile-*.json")):
        summary = json.loads(compile_json.read_text())
        print(f"## torch.compile reduce-overhead vs cgtool, {summary['model']} ({summary['gpu']})")
        print(f"cgtool capture {summary['cgtool_capture_s']:.1f} s; torch.compile compile + record "
              f"{summary.get('compile_compile_and_capture_s', float('nan')):.1f} s")


if __name__ == "__main__":
    main()
