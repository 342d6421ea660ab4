"""benchmarks/probe_verify_step_gap.py and probe_decode_after_prefill.py: on a machine without a
GPU each parses its arguments and stops with one line naming itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the probe would run")
@pytest.mark.parametrize(("script", "flags"), [
    ("probe_verify_step_gap.py", ["--modes", "replay,idle"]),
    ("probe_decode_after_prefill.py", ["--captures", "tiny_kept,same_stream"]),
])
def test_the_probe_without_a_gpu_says_so_in_one_line(script, flags):
    run = subprocess.run([sys.executable, str(BENCHMARKS / script), "--out", "unused.json", "--bs", "1,8", *flags],
                         check=False, capture_output=True, text=True, timeout=120, cwd=BENCHMARKS.parent)
    assert run.returncode == 1
    assert run.stderr.strip() == f"{script} needs a GPU"
