"""benchmarks/probe_verify_step_gap.py: on a machine without a GPU it parses its arguments and
stops with one line naming itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the probe would run")
def test_the_probe_without_a_gpu_says_so_in_one_line():
    script = "probe_verify_step_gap.py"
    run = subprocess.run([sys.executable, str(BENCHMARKS / script), "--out", "unused.json", "--bs", "1,8"],
                         check=False, capture_output=True, text=True, timeout=120, cwd=BENCHMARKS.parent)
    assert run.returncode == 1
    assert run.stderr.strip() == f"{script} needs a GPU"
