"""GPU checks of `cgtool verify` (run by scripts/gpu-check.sh verify on the GPU machine)."""

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from cgtool.commands.main import app

pytestmark = pytest.mark.gpu
runner = CliRunner()
TRACE = "examples/azure-conv-first-1000.jsonl"


@pytest.fixture(scope="module")
def small_plan(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan")
    result = runner.invoke(app, ["plan", "--trace", TRACE, "--model", "qwen2.5-0.5b", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out / "plan.json"


def test_verify_on_a_small_preset_measures_both_sets(small_plan, tmp_path):
    held_before = torch.cuda.memory_allocated()
    result = runner.invoke(app, ["verify", "--plan", str(small_plan), "--trace", TRACE,
                                 "--steps", "300", "--out", str(tmp_path)])
    assert result.exit_code in (0, 1), result.output
    # The session hands its model (1 GB) and KV pool (tens of GB) back: a later session in
    # this process would otherwise size its pool from what this one left.
    assert torch.cuda.memory_allocated() - held_before < 512 << 20
    data = json.loads((tmp_path / "verify.json").read_text())
    assert data["status"] == "complete" and [s["name"] for s in data["sets"]] == ["plan", "default"]
    for graph_set in data["sets"]:
        for field in ("mean_step_ms", "predicted_step_ms", "capture_s", "predicted_capture_s"):
            assert math.isfinite(graph_set[field]) and graph_set[field] > 0, field
        assert graph_set["graph_bytes"] > 0
        assert all(math.isfinite(r["measured_ms"]) and r["measured_ms"] > 0 for r in graph_set["sizes"])
    assert data["rehearsal"]["status"] == "ok" and data["rehearsal"]["headroom_bytes"] > 0
    assert (tmp_path / "verify.html").is_file()
    assert result.exit_code == int(data["ratio"]["verdict"] == "slower")


def test_an_out_of_memory_rehearsal_exits_1_and_names_the_remedy(small_plan, tmp_path):
    result = runner.invoke(app, ["verify", "--plan", str(small_plan), "--steps", "50",
                                 "--mem-fraction-static", "0.999", "--out", str(tmp_path)])
    assert result.exit_code == 1, result.output
    assert "Lower --mem-fraction-static to" in result.output
    data = json.loads((tmp_path / "verify.json").read_text())
    assert data["status"] == "oom" and data["rehearsal"]["remedy"]
