import copy

import pytest
from planner_fixture import CFG, H100, REPORT

from cgtool.documents.results import CaptureReport
from cgtool.errors import InputError
from cgtool.planner.cost import roofline_cost
from cgtool.planner.profile_fit import merge_context_reports, predicted_graph_bytes, profile_cost
from cgtool.specs.config import load_model_config
from cgtool.specs.gpus import gpu_spec


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


def _decode_report(context_len: int, times: dict[int, float], piecewise_ms: float | None = None) -> dict:
    """A hand-made capture report: decode sizes timed at one context (graph and eager alike)."""
    rows = [{"kind": "decode", "size": n, "status": "ok", "eager_ms": ms, "replay_ms": ms,
             "capture_s": 0.1, "retained_bytes": 0, "non_torch_bytes": 0} for n, ms in times.items()]
    if piecewise_ms is not None:
        rows.append({"kind": "piecewise", "size": 64, "status": "ok", "eager_ms": piecewise_ms,
                     "replay_ms": piecewise_ms, "capture_s": 0.2, "retained_bytes": 0, "non_torch_bytes": 0})
    return {"settings": {"context_len": context_len}, "sizes": rows, "totals": {}}


def test_decode_timed_at_two_contexts_prices_attention_per_context_token():
    # Size 1 grows 0.2 ms from 1,000 to 3,000 tokens (2,000 tokens read), size 2 0.4 ms
    # (4,000 tokens): 1e-4 ms a token; the dense parts are 5.0 - 0.1 and 6.0 - 0.2.
    merged = merge_context_reports([_decode_report(1000, {1: 5.0, 2: 6.0}, piecewise_ms=20.0),
                                    _decode_report(3000, {1: 5.2, 2: 6.4})])
    model = profile_cost(merged, CFG, H100, max_bs=4, max_tokens=64, source="m")
    assert model.kv_read_ms_per_token == pytest.approx(1e-4)
    assert model.decode_graph_ms[1] == pytest.approx(4.9)
    assert model.decode_graph_ms[2] == pytest.approx(5.8)
    assert model.decode_eager_ms[2] == pytest.approx(5.8)


def test_attention_price_is_the_least_squares_slope_within_each_size():
    # Deviations from each size's means: size 1 x = -/+1000 tokens, y = -/+0.15 ms; size 2
    # x = -/+2000 (2 requests x 1000), y = -/+0.2: slope = (2*150 + 2*400) / (2*1e6 + 2*4e6).
    merged = merge_context_reports([_decode_report(1000, {1: 5.0, 2: 6.0}),
                                    _decode_report(3000, {1: 5.3, 2: 6.4})])
    model = profile_cost(merged, CFG, H100, max_bs=4, max_tokens=64, source="m")
    assert model.kv_read_ms_per_token == pytest.approx(1100 / 10e6)


def test_one_context_keeps_the_rooflines_attention_price():
    single = _decode_report(1000, {1: 5.0, 2: 6.0})
    model = profile_cost(single, CFG, H100, max_bs=4, max_tokens=64, source="s")
    roofline = roofline_cost(CFG, H100, max_bs=4, max_tokens=64)
    assert model.kv_read_ms_per_token == roofline.kv_read_ms_per_token
    assert model.decode_graph_ms[1] == pytest.approx(5.0 - roofline.kv_read_ms_per_token * 1000)


def test_a_falling_time_with_context_is_noise_not_a_price():
    merged = merge_context_reports([_decode_report(1000, {1: 5.0}), _decode_report(3000, {1: 4.9})])
    model = profile_cost(merged, CFG, H100, max_bs=4, max_tokens=64, source="m")
    assert model.kv_read_ms_per_token == roofline_cost(CFG, H100, max_bs=4, max_tokens=64).kv_read_ms_per_token


def test_merge_keeps_the_first_reports_piecewise_rows_and_marks_each_rows_context():
    first = _decode_report(1000, {1: 5.0}, piecewise_ms=20.0)
    other = _decode_report(8000, {1: 5.7}, piecewise_ms=99.0)
    merged = merge_context_reports([first, other])
    assert [(r["kind"], r.get("context_len")) for r in merged["sizes"]] == [
        ("decode", None), ("piecewise", None), ("decode", 8000)]
    assert merged["settings"] == first["settings"]
    assert "context_len" not in other["sizes"][0]  # the inputs are left as they were
    model = profile_cost(merged, CFG, H100, max_bs=4, max_tokens=64, source="m")
    roofline = roofline_cost(CFG, H100, max_bs=4, max_tokens=64)
    assert model.extend_graph_ms[64] == pytest.approx(20.0 - roofline.attention_ms_per_pair * 64 * 65 / 2)


def test_a_merged_report_reads_back_as_a_capture_report_with_its_contexts():
    # The planner fixture at 1,024 tokens, and its decode rows again at 4,096, each 0.3 ms
    # slower per request: 0.3 ms / 3,072 tokens a token, read back through the report's loader.
    longer = copy.deepcopy(REPORT)
    longer["settings"]["context_len"] = 4096
    for row in longer["sizes"]:
        row["replay_ms"] += 0.3 * row["size"]
    merged = CaptureReport.from_dict(merge_context_reports([REPORT, longer]), "merged.json").to_dict()
    assert {r.get("context_len") for r in merged["sizes"]} == {None, 4096}
    model = profile_cost(merged, CFG, H100, max_bs=256, max_tokens=8192, source="m")
    assert model.kv_read_ms_per_token == pytest.approx(0.3 / 3072)


def test_decode_graphs_timed_alone_get_the_server_gap_on_each_of_their_kernels():
    # A `capture --kind decode` report times its graphs with no prefill graph beside them, which
    # ran each kernel 0.31-0.45 us closer than a server's process does (H200, 2026-11-28,
    # benchmarks/results/h200-2026-11-28-graph-gaps): the profile adds that, from the report's
    # own kernel count, and says so. A report of both kinds was timed as a server runs.
    from cgtool.planner.cost import SERVER_GRAPH_GAP_MS

    both = copy.deepcopy(REPORT)
    both["settings"]["kinds"] = ["decode", "piecewise"]
    alone = copy.deepcopy(both)
    alone["settings"]["kinds"] = ["decode"]
    for row in alone["sizes"]:
        row["kernels_per_forward"] = 400
    served = profile_cost(both, CFG, H100, max_bs=64, max_tokens=64, source="both.json")
    lone = profile_cost(alone, CFG, H100, max_bs=64, max_tokens=64, source="alone.json")
    assert lone.decode_graph_ms[1:] - served.decode_graph_ms[1:] == pytest.approx(400 * SERVER_GRAPH_GAP_MS)
    assert (lone.extend_graph_ms == served.extend_graph_ms).all()
    assert any("no prefill graph captured" in w and "148 us" in w for w in lone.warnings)
    assert not any("prefill graph" in w for w in served.warnings)
