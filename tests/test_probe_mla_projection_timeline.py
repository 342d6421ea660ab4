"""benchmarks/probe_mla_projection_timeline.py: its log line is made from the medians it saves."""

from __future__ import annotations

import json
import lzma
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CALL = ROOT / "benchmarks" / "results" / "h100-h200-2026-11-27-mla-step-and-trials" / "call13-h100"


def test_the_summary_line_restates_the_logged_run_from_its_saved_medians():
    # Call 13's stamps.json and stamps.log came from one run; the line made again from the JSON
    # must be the logged one, the merge step's breakdown included.
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from probe_mla_projection_timeline import summary_line
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    row = json.loads(lzma.decompress((CALL / "stamps.json.xz").read_bytes()))["cases"][0]
    logged = next(line for line in (CALL / "stamps.log").read_text().splitlines() if "16x1024 shipped:" in line)
    assert logged.split("16x1024 shipped: ", 1)[1] == summary_line(row)
    assert "its merge's last step: partials in shared memory 1.38" in summary_line(row)
