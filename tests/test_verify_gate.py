"""`check` on two verify.json files (cgtool.verify.gate), with the H100 runs of 2026-11-26
(benchmarks/results/h100-2026-11-26-memory) as baselines."""

from __future__ import annotations

import copy
from pathlib import Path

from typer.testing import CliRunner

from cgtool.commands.main import app
from cgtool.verify.gate import compare_verifies, proven_figures
from cgtool.verify.result import load_verify, write_verify

RUN = Path(__file__).resolve().parents[1] / "benchmarks/results/h100-2026-11-26-memory/llama-3.1-8b-azure-conv-first-1000"
GIB = 1 << 30


def test_the_gate_reads_the_recommended_fractions_own_rehearsal():
    result = load_verify(RUN / "verify.json")
    figures = proven_figures(result)
    assert figures["mem_fraction_static"] == result.proof.mem_fraction_static
    assert figures["proven_headroom"] == result.proof.rehearsal.headroom_bytes


def test_the_same_run_passes():
    result = load_verify(RUN / "verify.json")
    assert compare_verifies(result, copy.deepcopy(result)).passed


def test_shrunk_headroom_or_grown_graphs_fail():
    base = load_verify(RUN / "verify.json")
    tighter = copy.deepcopy(base)
    tighter.proof.rehearsal.headroom_bytes -= GIB // 2
    assert [c.metric for c in compare_verifies(base, tighter).regressions] == ["proven_headroom"]
    bigger = copy.deepcopy(base)
    bigger.sets[0].graph_bytes = int(bigger.sets[0].graph_bytes * 1.2)
    assert [c.metric for c in compare_verifies(base, bigger).regressions] == ["graph_bytes"]


def test_a_run_that_proved_nothing_fails(tmp_path):
    base = load_verify(RUN / "verify.json")
    failed = copy.deepcopy(base)
    failed.recommended_mem_fraction_static = None
    write_verify(base, tmp_path / "a.json")
    write_verify(failed, tmp_path / "b.json")
    out = CliRunner().invoke(app, ["check", str(tmp_path / "a.json"), str(tmp_path / "b.json")])
    assert out.exit_code == 1, out.output
    assert "proved no fraction" in out.output
    same = CliRunner().invoke(app, ["check", str(tmp_path / "a.json"), str(tmp_path / "a.json")])
    assert same.exit_code == 0, same.output
