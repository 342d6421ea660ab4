"""`cgtool capture --tp N`: what is refused before any rank starts (runs without a GPU)."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from cgtool.commands.main import app

runner = CliRunner()


def _pretend_gpus(monkeypatch, count):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def _one_sentence(output):
    assert "Traceback" not in output
    assert len([line for line in output.splitlines() if line.strip()]) <= 3  # click wraps its box


def test_tp_below_one_is_a_usage_error():
    result = runner.invoke(app, ["capture", "--model", "tiny", "--tp", "0"])
    assert result.exit_code == 2 and "--tp" in result.output


def test_more_ranks_than_visible_gpus_exits_2(monkeypatch):
    _pretend_gpus(monkeypatch, 1)
    result = runner.invoke(app, ["capture", "--model", "tiny", "--tp", "2"])
    assert result.exit_code == 2
    assert "--tp 2 needs 2 GPUs but 1 is visible" in result.output
    _one_sentence(result.output)


@pytest.mark.parametrize(("model", "tp", "words"), [
    ("tiny", "3", "4 attention heads"),
    ("qwen2.5-7b", "7", "4 KV heads"),
])
def test_tp_that_does_not_divide_the_model_exits_2(monkeypatch, model, tp, words):
    _pretend_gpus(monkeypatch, 8)
    result = runner.invoke(app, ["capture", "--model", model, "--tp", tp])
    assert result.exit_code == 2 and words in result.output
    _one_sentence(result.output)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_tp_without_any_gpu_says_so():
    result = runner.invoke(app, ["capture", "--model", "tiny", "--tp", "2"])
    assert result.exit_code == 2 and "needs a CUDA GPU" in result.output


def test_ctrl_c_with_tp_writes_every_ranks_partial_rows(tmp_path, monkeypatch):
    import json
    from pathlib import Path

    from cgtool.capture import session, tp

    fixture = Path(__file__).parent / "data" / "reports" / "h100-llama-3.1-8b" / "report.json"

    def partial(rank):
        data = json.loads(fixture.read_text())
        data["settings"]["tp_size"], data["sizes"] = 2, data["sizes"][:2]
        return data

    def interrupted(opts, on_progress):
        interrupt = KeyboardInterrupt()
        interrupt.rank_partials = {0: partial(0), 1: partial(1)}
        raise interrupt

    _pretend_gpus(monkeypatch, 2)
    monkeypatch.setattr(session, "require_cuda", lambda: None)
    monkeypatch.setattr(tp, "run_capture_tp", interrupted)
    out = tmp_path / "run"
    result = runner.invoke(app, ["capture", "--model", "tiny", "--tp", "2", "--out", str(out)])
    assert result.exit_code == 130, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "incomplete" and report["incomplete_reason"] == "interrupted by SIGINT"
    assert sorted({row["rank"] for row in report["sizes"]}) == [0, 1]
    assert len(report["rank_totals"]) == 2
