"""The phase table of capture reports, beside each run's wall time from process start.

Usage: python benchmarks/bench_phases.py RUN_DIR=WALL_S [RUN_DIR=WALL_S ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

from cgtool.documents.results import load_report
from cgtool.reports.tables import PHASES


def main() -> None:
    print(f"{'run':34} {'wall':>7} " + " ".join(f"{p:>8}" for p in PHASES)
          + f" {'other':>8} {'measure%':>9} {'+profile%':>10} {'sizes':>6}")
    for arg in sys.argv[1:]:
        folder, _, wall = arg.partition("=")
        report = load_report(Path(folder) / "report.json")
        phases = report.totals.phase_s
        wall_s = float(wall) if wall else float("nan")
        measure = phases.get("measure", 0.0)
        counted = measure + phases.get("profile", 0.0)  # kernel counting as measuring too
        cells = " ".join(f"{phases.get(p, 0.0):8.1f}" for p in PHASES)
        other = wall_s - sum(phases.values())  # between phases, and after the report is written
        print(f"{Path(folder).name:34} {wall_s:7.1f} {cells} {other:8.1f} {100 * measure / wall_s:8.1f}% {100 * counted / wall_s:9.1f}% "
              f"{len(report.sizes):6d}")


if __name__ == "__main__":
    main()
