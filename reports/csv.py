"""sizes.csv: one row per captured size, every measured figure plus derived columns."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pandas as pd

from cgtool.documents.results import CaptureReport


def sizes_frame(report: CaptureReport) -> pd.DataFrame:
    """Sizes in capture order (per kind, largest first) with cumulative pool growth; with --tp,
    every rank's rows, rank by rank."""
    rows = [asdict(row) for rank in range(report.settings.tp_size) for kind in report.kinds()
            for row in report.sizes_of(kind, rank)]
    frame = pd.DataFrame(rows, columns=[f for f in _COLUMNS])
    if frame.empty:  # a run stopped before its first size: typed empty columns
        frame = frame.astype({"retained_bytes": "int64", "replay_ms": "float64", "roofline_ms": "float64"})
    frame["cumulative_retained_bytes"] = frame.groupby(["rank", "kind"])["retained_bytes"].cumsum()
    replay = frame["replay_ms"].astype("float64")
    frame["roofline_pct"] = 100 * frame["roofline_ms"].astype("float64") / replay
    return frame


def write_sizes_csv(report: CaptureReport, path: Path) -> Path:
    sizes_frame(report).to_csv(path, index=False)
    return path


_COLUMNS = ["kind", "size", "rank", "status", "capture_s", "retained_bytes", "peak_bytes",
            "non_torch_bytes", "eager_ms", "replay_ms", "speedup", "roofline_ms",
            "kernels_per_forward", "max_abs_diff", "experts_active", "mla_chunks_redone"]
