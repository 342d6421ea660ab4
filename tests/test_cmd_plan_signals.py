"""Ctrl-C / SIGTERM during `cgtool plan`: the plan of what was simulated is kept, marked incomplete."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


def _big_trace(path: Path, n: int = 400_000) -> Path:
    # Long enough that the simulation is still running when the signal lands (several seconds).
    rng = np.random.default_rng(7)
    arrival = np.cumsum(rng.exponential(0.02, n))
    inputs = rng.integers(50, 2000, n)
    outputs = rng.integers(20, 400, n)
    lines = (f'{{"arrival": {a:.4f}, "input_len": {i}, "output_len": {o}}}' for a, i, o in zip(arrival, inputs, outputs))
    path.write_text("\n".join(lines) + "\n")
    return path


def _plan_then_signal(trace: Path, out: Path, signum: int, wait_for: str) -> tuple[int, str]:
    env = dict(os.environ, COLUMNS="200", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "cgtool.commands.entry", "plan", "--trace", str(trace), "--gpu", "H100-80GB", "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    seen = ""
    while wait_for not in seen:
        line = proc.stderr.readline()
        assert line, f"plan ended before printing {wait_for!r}"
        seen += line
    time.sleep(0.3)  # well inside that stage, which takes a second or more at this size
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=120)
    return proc.returncode, seen + stdout + stderr


@pytest.fixture(scope="module")
def big_trace(tmp_path_factory) -> Path:
    return _big_trace(tmp_path_factory.mktemp("trace") / "big.jsonl")


@pytest.mark.parametrize(("signum", "code", "name"), [(signal.SIGINT, 130, "SIGINT"), (signal.SIGTERM, 143, "SIGTERM")])
def test_signal_during_simulation_writes_an_incomplete_plan(big_trace, tmp_path, signum, code, name):
    out = tmp_path / "plan"
    rc, output = _plan_then_signal(big_trace, out, signum, wait_for="simulating")
    assert rc == code, output
    assert f"interrupted by {name}" in output
    plan = json.loads((out / "plan.json").read_text())
    assert plan["status"] == "incomplete"
    assert plan["warnings"][0].startswith("incomplete: simulation stopped after")
    assert plan["decode"]["capture_bs"], "the partial simulation still yields decode sizes"
    assert "Traceback" not in output


def test_signal_before_simulation_writes_nothing(big_trace, tmp_path):
    out = tmp_path / "plan"
    rc, output = _plan_then_signal(big_trace, out, signal.SIGINT, wait_for="reading")
    assert rc == 130, output
    assert "no plan was written" in output
    assert not (out / "plan.json").exists()
    assert "Traceback" not in output
