"""Decode graphs at each hidden-state mode on the GPU: replay equals eager on the logits and on
the hidden states, after a first capture and after a recapture upward."""

import json

import pytest
import torch
from typer.testing import CliRunner

from cgtool.capture.measure import compare_outputs
from cgtool.specs.config import load_model_config
from cgtool.specs.hidden_states import HiddenMode

pytestmark = pytest.mark.gpu
SIZES = [1, 2, 4, 8, 16]


@pytest.fixture(scope="module")
def bench():
    from cgtool.capture.workbench import build_workbench

    return build_workbench(
        load_model_config("qwen2.5-0.5b"), weights_dir=None, dtype=torch.bfloat16,
        mem_fraction_static=0.5, max_bs=16, max_tokens=64, context_len=300, seed=0, kv_tokens=8192,
    )


def _assert_replay_equals_eager(runner, bench, mode):
    hidden = bench.cfg.hidden_size
    for bs in (1, 3, 8, 13, 16):  # captured sizes and padded ones
        batch = bench.decode_batch(bs)
        eager = [t.float().clone() for t in runner.eager_outputs(batch)]
        replayed = [t.float().clone() for t in runner.replay_outputs(batch)]
        assert len(replayed) == (1 if mode is HiddenMode.NULL else 2)
        if mode is not HiddenMode.NULL:
            assert replayed[1].shape == (bs, hidden)
        diff, tolerance, output, row = compare_outputs(eager, replayed, torch.bfloat16)
        assert diff <= tolerance, f"{mode.name} bs {bs}: output {output} row {row} differs by {diff:.3g}"


@pytest.mark.parametrize("mode", list(HiddenMode))
def test_each_mode_replays_the_logits_and_hidden_states_eager_computes(bench, mode):
    from cgtool.runners.decode import DecodeGraphRunner

    runner = DecodeGraphRunner(bench.runner, SIZES, hidden_mode=mode)
    runner.capture()
    _assert_replay_equals_eager(runner, bench, mode)


def test_recapture_from_null_to_full_replays_the_hidden_states(bench):
    from cgtool.runners.decode import DecodeGraphRunner

    runner = DecodeGraphRunner(bench.runner, SIZES)
    runner.capture()
    runner.recapture(HiddenMode.FULL)
    assert runner.captured_bs == SIZES and len(runner.retired_graphs) == len(SIZES)
    _assert_replay_equals_eager(runner, bench, HiddenMode.FULL)


def test_capture_cli_reports_a_row_per_mode_and_size(tmp_path):
    from cgtool.commands.main import app

    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "capture", "--model", "qwen2.5-0.5b", "--kind", "decode", "--bs", "1,4",
        "--context-len", "256", "--hidden-states", "null,full", "--out", str(out),
    ])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["hidden_states"] == ["null", "full"]
    rows = {(row["hidden_mode"], row["size"]): row for row in report["sizes"]}
    assert set(rows) == {("null", 1), ("null", 4), ("full", 1), ("full", 4)}
    assert all(row["status"] == "ok" and row["capture_s"] > 0 for row in rows.values())
    assert all(row["kernels_per_forward"] > 0 for row in rows.values())
