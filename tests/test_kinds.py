"""The order a capture session visits sizes in (GPU): capture largest first, measure smallest
first."""

from __future__ import annotations

import pytest

from cgtool.capture.options import CaptureOptions, CaptureProgress, SessionState
from cgtool.capture.session import run_capture

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("kind", ["piecewise", "decode"])
def test_each_kind_captures_largest_first_and_measures_smallest_first(tmp_path, kind):
    """Capture order lets smaller graphs reuse the pool; measure order makes the first sizes,
    whose second calls seed the spread, the cheapest ones (sampling.py)."""
    sizes = [16, 64, 32]
    opts = CaptureOptions(
        model="qwen2.5-0.5b", kinds=(kind,), capture_bs=sizes if kind == "decode" else [],
        capture_num_tokens=sizes if kind == "piecewise" else [],
        context_len=128, max_total_tokens=20_000, out_dir=tmp_path,
    )
    events: list[CaptureProgress] = []
    report = run_capture(opts, events.append, SessionState())
    order = {phase: [e.size for e in events if e.kind == kind and e.phase == phase and e.size]
             for phase in ("capture", "measure")}
    assert order["capture"][:3] == [64, 32, 16]
    assert order["measure"][:3] == [16, 32, 64]
    assert [row.size for row in report.sizes] == [16, 32, 64]
    assert all(row.status == "ok" for row in report.sizes)
