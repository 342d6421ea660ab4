"""benchmarks/bench_mla_step_settings.py and bench_mla_dependent.py, which share its step setup:
on a machine without a GPU each parses its arguments and stops with one line naming itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the benchmarks would run")
@pytest.mark.parametrize(("script", "extra"), [
    ("bench_mla_step_settings.py", ["--settings", "tr:GLUON_KERNEL=0"]),
    ("bench_mla_dependent.py", []),
])
def test_a_step_benchmark_without_a_gpu_says_so_in_one_line(script, extra):
    run = subprocess.run([sys.executable, str(BENCHMARKS / script), "--out", "unused.json", "--bs", "8,16", *extra],
                         check=False, capture_output=True, text=True, timeout=120, cwd=BENCHMARKS.parent)
    assert run.returncode == 1
    assert run.stderr.strip() == f"{script} needs a GPU"


def _parse_settings(text: str) -> dict:
    """The layers' probe's --settings parser, imported from benchmarks/."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from probe_mla_projection import parse_settings
    finally:
        sys.path.remove(str(BENCHMARKS))
    return parse_settings(text)


def test_settings_are_named_and_set_as_the_layers_probe_sets_them():
    # The step benchmark reads --settings with the layers' probe's parser, so that one setting
    # string times the same constants in both.
    assert _parse_settings("tr:GLUON_KERNEL=0;r2:ROW_BLOCKS=2,wg.Q_FIRST=1") == {
        "fused_tr": {"GLUON_KERNEL": 0}, "fused_r2": {"ROW_BLOCKS": 2, "wg.Q_FIRST": 1}}


def test_a_setting_of_integers_joined_by_slashes_sets_a_tuple():
    # WGMMA_TILES is (keys a tile, buffers, warps): a trial of one buffer sets it whole.
    assert _parse_settings("b1:wg.WGMMA_TILES=64/1/4,tm.WGMMA_PROGRAMS=264") == {
        "fused_b1": {"wg.WGMMA_TILES": (64, 1, 4), "tm.WGMMA_PROGRAMS": 264}}
