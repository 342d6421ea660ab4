"""Tensor parallelism on two GPUs (NCCL): captured all-reduces replay to TP=1's logits.

Run by `scripts/gpu-check.sh tp` on the two-GPU machine; skipped with fewer GPUs.
"""

from __future__ import annotations

import json

import pytest
import torch
import tp_worker
from typer.testing import CliRunner

from cgtool.capture.launch import run_ranks
from cgtool.commands.main import app

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs"),
]
# bf16 logits of TP=2 and TP=1 differ only by the order of the partial sums of the
# row-parallel matmuls: a few ulps of bf16 (eps 2^-7) at the logits' scale. A missing or
# doubled all-reduce is off by the scale itself.
ULPS = 4


def test_tp2_decode_and_piecewise_replays_equal_tp1_eager():
    results = run_ranks(tp_worker.parity_rank_gpu, 2, ("qwen2.5-0.5b", [1, 2, 4, 8], [64, 128, 256]))
    print(json.dumps({str(k): v for k, v in results.items()}, indent=1))
    checked = [k for k in results if isinstance(k, tuple)]
    assert {k[0] for k in checked} == {"decode", "piecewise"} and len(checked) == 6 + 4
    for key in checked:
        r = results[key]
        tol = ULPS * torch.finfo(torch.bfloat16).eps * max(1.0, r["scale"])
        assert r["max_abs_diff"] <= tol, (key, r)
        assert r["argmax_agree"] >= 0.99, (key, r)
        if key[0] == "decode":  # and against this TP=2 model's own eager run, as capture checks
            own = r["vs_own_eager"]
            assert own["max_abs_diff"] <= ULPS * torch.finfo(torch.bfloat16).eps * max(1.0, own["scale"])
    assert results["replays"] == (6, 4)
    # 24 layers: embedding all-reduce, then attention, O and down all-reduces split each layer.
    assert results["pieces"] == 3 * 24 + 2


def test_capture_cli_tp2_writes_every_rank_verified(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "capture", "--model", "qwen2.5-0.5b", "--tp", "2", "--bs", "1,4,16", "--tokens", "64,256",
        "--context-len", "256", "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["tp_size"] == 2 and len(report["rank_totals"]) == 2
    keys = {(r["kind"], r["size"], r["rank"]) for r in report["sizes"]}
    assert keys == {(k, s, rank) for rank in (0, 1)
                    for k, s in [("decode", 1), ("decode", 4), ("decode", 16),
                                 ("piecewise", 64), ("piecewise", 256)]}
    assert all(r["status"] == "ok" for r in report["sizes"]), report["sizes"]
    assert "Spread between ranks" in result.output
    totals = report["rank_totals"]
    assert totals[0]["kv_tokens"] == totals[1]["kv_tokens"]  # the pool sized by the tighter GPU
    assert totals[0]["weights_bytes"] == totals[1]["weights_bytes"]
