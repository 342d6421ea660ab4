import copy

import pytest
from planner_fixture import CFG, H100, REPORT

from cgtool.specs.config import load_model_config
from cgtool.errors import InputError
from cgtool.specs.gpus import gpu_spec
from cgtool.planner.profile_fit import predicted_graph_bytes, profile_cost


def test_profile_reproduces_measured_sizes_and_interpolates_between():
    model = profile_cost(REPORT, CFG, H100, max_bs=512, max_tokens=8192, source="fixture")
    measured = {r["size"]: r for r in REPORT["sizes"] if r["kind"] == "decode"}
    for size in (16, 24, 256):
        total = model.decode_graph_ms[size] + model.kv_read_ms_per_token * size * 1024
        assert total == pytest.approx(measured[size]["replay_ms"], rel=1e-9)
    midpoint = (model.decode_graph_ms[16] + model.decode_graph_ms[24]) / 2
    assert model.decode_graph_ms[20] == pytest.approx(midpoint)
    assert model.decode_eager_ms[400] > model.decode_eager_ms[256]  # extended past the last size


def test_profile_ignores_failed_sizes():
    report = copy.deepcopy(REPORT)
    for row in report["sizes"]:
        if row["kind"] == "decode" and row["size"] == 8:
            row["status"], row["replay_ms"] = "failed", 1000.0
    model = profile_cost(report, CFG, H100, max_bs=64, max_tokens=64, source="r")
    assert model.decode_graph_ms[8] < 10


def test_profile_without_any_good_size_is_refused():
    report = copy.deepcopy(REPORT)
    for row in report["sizes"]:
        row["status"] = "failed"
    with pytest.raises(InputError, match="no size was captured"):
        profile_cost(report, CFG, H100, max_bs=64, max_tokens=64, source="r.json")


def test_profile_from_another_gpu_or_model_is_flagged():
    model = profile_cost(REPORT, CFG, gpu_spec("A100-80GB"), max_bs=64, max_tokens=64, source="r")
    assert any("measured on NVIDIA H100" in w for w in model.warnings)
    other = profile_cost(
        REPORT, load_model_config("qwen2.5-7b"), H100, max_bs=64, max_tokens=64, source="r"
    )
    assert any("another model" in w for w in other.warnings)
    assert not profile_cost(REPORT, CFG, H100, max_bs=64, max_tokens=64, source="r").warnings


def test_profile_scales_the_pool_to_the_measured_one():
    model = profile_cost(REPORT, CFG, H100, max_bs=512, max_tokens=8192, source="r")
    assert model.extend_pool_bytes[8192] == pytest.approx(REPORT["totals"]["graph_pool_bytes"])


def test_prediction_for_a_report_is_set_beside_its_measurement():
    predicted, measured = predicted_graph_bytes(REPORT, CFG, H100)
    assert measured == REPORT["totals"]["graph_pool_bytes"] + REPORT["totals"]["non_torch_bytes"]
    assert predicted > 0


def test_a_profile_from_another_tp_size_is_flagged():
    model = profile_cost(REPORT, CFG, H100, max_bs=64, max_tokens=64, source="r", tp_size=2)
    assert any("measured at --tp 1, the plan is for --tp 2" in w for w in model.warnings)


def test_a_tp_report_is_read_from_rank_0_and_matches_a_plan_of_its_tp():
    report = copy.deepcopy(REPORT)
    report["settings"]["tp_size"] = 2
    other_rank = [dict(row, rank=1, replay_ms=1000.0) for row in report["sizes"]]
    report["sizes"] = [dict(row, rank=0) for row in report["sizes"]] + other_rank
    model = profile_cost(report, CFG, H100, max_bs=512, max_tokens=8192, source="r", tp_size=2)
    assert not any("--tp" in w for w in model.warnings)
    assert model.decode_graph_ms[256] < 100  # rank 1's rows were left out
