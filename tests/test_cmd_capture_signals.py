"""SIGTERM, a hard death or a failing save in any phase of `cgtool capture --profile`: a
report.json marked incomplete is always left. The session is replaced by one that walks the
real phases (SessionState.phase) over a saved H100 report's rows, on the CPU."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cgtool.commands.main import app
from cgtool.documents.results import load_report
from cgtool.specs.config import load_model_config

runner = CliRunner()
MEASURED = load_report(Path(__file__).parent / "data" / "reports" / "h100-llama-3.1-8b")
PHASES = ["load", "compile", "capture", "measure", "profile"]  # a profiled session's order


class Died(BaseException):
    """Stands for SIGKILL or a crash in the driver: nothing of cgtool's runs after it."""


def _session(stop_in: str, how: str):
    def run(opts, on_progress, state):
        state.cfg = load_model_config("llama-3.1-8b")
        for phase in PHASES:
            with state.phase(phase):
                if phase == stop_in and how == "sigterm":
                    signal.raise_signal(signal.SIGTERM)  # the handler runs before it returns
                if phase == stop_in and how == "dies":
                    raise Died
                if phase == "load":
                    state.totals = MEASURED.totals
                if phase == "measure":
                    state.sizes = list(MEASURED.sizes)
                if phase == "profile":
                    state.kernel_tables["decode:1"] = []
        return MEASURED
    return run


def _capture(tmp_path, monkeypatch, stop_in, how):
    from cgtool.capture import session

    monkeypatch.setattr(session, "require_cuda", lambda: None)
    monkeypatch.setattr(session, "environment", lambda: MEASURED.environment)
    monkeypatch.setattr(session, "run_capture", _session(stop_in, how))
    out = tmp_path / "run"
    result = runner.invoke(app, ["capture", "--model", "llama-3.1-8b", "--profile", "--out", str(out)],
                           catch_exceptions=True)
    return result, out


@pytest.mark.parametrize("phase", PHASES)
def test_sigterm_in_any_phase_keeps_the_partial_report(tmp_path, monkeypatch, phase):
    result, out = _capture(tmp_path, monkeypatch, phase, "sigterm")
    assert result.exit_code == 143, result.output
    saved = load_report(out)
    assert saved.status == "incomplete"
    assert saved.incomplete_reason == f"interrupted by SIGTERM during {phase}"
    before = PHASES[: PHASES.index(phase) + 1]  # the signal's phase included, cut short
    assert set(saved.totals.phase_s) == {*before, "render"}
    assert len(saved.sizes) == (len(MEASURED.sizes) if phase == "profile" else 0)


@pytest.mark.parametrize("phase", PHASES)
def test_a_process_that_dies_in_any_phase_leaves_the_report_as_that_phase_began(tmp_path, monkeypatch, phase):
    with pytest.raises(Died):  # nothing of cgtool's runs after it
        _capture(tmp_path, monkeypatch, phase, "dies")
    out = tmp_path / "run"
    saved = load_report(out)
    assert saved.status == "incomplete"
    assert saved.incomplete_reason == (
        f"the session ended during {phase} without saving again (killed or crashed)")
    assert set(saved.totals.phase_s) == set(PHASES[: PHASES.index(phase)])
    assert len(saved.sizes) == (len(MEASURED.sizes) if phase == "profile" else 0)


def test_a_partial_report_that_cannot_be_built_leaves_the_checkpoint_and_one_line(tmp_path, monkeypatch):
    from cgtool.capture import session

    def broken(opts, state, reason):
        raise RuntimeError("CUPTI is gone")

    monkeypatch.setattr(session, "partial_report", broken)
    result, out = _capture(tmp_path, monkeypatch, "profile", "sigterm")
    assert result.exit_code == 143
    assert "the partial report could not be saved (RuntimeError: CUPTI is gone)" in result.stderr
    assert "Traceback" not in result.output
    saved = load_report(out)
    assert saved.status == "incomplete" and "during profile" in saved.incomplete_reason
    assert len(saved.sizes) == len(MEASURED.sizes)


def test_a_complete_session_overwrites_its_checkpoints(tmp_path, monkeypatch):
    result, out = _capture(tmp_path, monkeypatch, "none", "")
    assert result.exit_code == 0, result.output
    assert load_report(out).status == "complete"
