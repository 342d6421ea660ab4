"""compare_reports / compare_plans: which changes are regressions, and when to refuse."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from cgtool.documents.compare import compare_plans, compare_reports
from cgtool.documents.plan_document import Plan
from cgtool.documents.results import load_plan, load_report
from cgtool.errors import InputError

FIXTURES = Path(__file__).parent / "data" / "reports"
BASELINE = load_report(FIXTURES / "h100-llama-3.1-8b")
PLAN = load_plan(FIXTURES / "plan-llama-3.1-8b")
MIB = 1 << 20


def _current():
    return copy.deepcopy(BASELINE)


def _size(report, kind, size):
    return next(s for s in report.sizes if s.kind == kind and s.size == size)


def test_identical_reports_pass_and_compare_every_size_and_total():
    result = compare_reports(BASELINE, _current())
    assert result.passed
    assert len(result.changes) == 42 + 1  # 36 decode + 6 piecewise sizes, plus the total
    assert {c.change_pct for c in result.changes} == {0.0}


def test_ten_percent_more_retained_memory_at_one_size_regresses_that_size_only():
    current = _current()
    _size(current, "decode", 128).retained_bytes = int(_size(current, "decode", 128).retained_bytes * 1.10)
    result = compare_reports(BASELINE, current, max_regress_pct=5.0)
    assert [(c.label, c.metric) for c in result.regressions] == [("decode bs 128", "retained_mem")]
    assert result.regressions[0].change_pct == pytest.approx(10.0, abs=0.1)


def test_change_within_threshold_passes():
    current = _current()
    row = _size(current, "piecewise", 4096)
    row.retained_bytes = int(row.retained_bytes * 1.04)
    assert compare_reports(BASELINE, current, max_regress_pct=5.0).passed


def test_less_memory_is_never_a_regression():
    current = _current()
    _size(current, "decode", 256).retained_bytes //= 2
    current.totals.graph_pool_bytes //= 2
    assert compare_reports(BASELINE, current).passed


def test_tiny_absolute_growth_below_one_mib_is_not_flagged_even_at_large_percent():
    current, baseline = _current(), _current()
    _size(baseline, "decode", 8).retained_bytes = 100 * 1024
    _size(current, "decode", 8).retained_bytes = 300 * 1024  # +200 % but only 200 KiB
    assert compare_reports(baseline, current).passed


def test_latency_uses_the_looser_threshold():
    current = _current()
    row = _size(current, "decode", 1)
    row.replay_ms = row.replay_ms * 1.10  # +10 %: noise for latency, a regression for memory
    metrics = ["retained_mem", "replay_ms"]
    assert compare_reports(BASELINE, current, metrics, 5.0, latency_regress_pct=15.0).passed
    failed = compare_reports(BASELINE, current, metrics, 5.0, latency_regress_pct=8.0)
    assert [(c.label, c.metric) for c in failed.regressions] == [("decode bs 1", "replay_ms")]


def test_latency_is_not_compared_by_default():
    current = _current()
    _size(current, "decode", 1).replay_ms *= 3
    result = compare_reports(BASELINE, current)
    assert result.passed and result.metrics == ["retained_mem"]


def test_added_and_removed_sizes_are_listed():
    current = _current()
    current.sizes = [s for s in current.sizes if not (s.kind == "decode" and s.size == 248)]
    extra = copy.deepcopy(_size(current, "piecewise", 4096))
    extra.size = 8192
    current.sizes.append(extra)
    result = compare_reports(BASELINE, current)
    assert result.removed == ["decode bs 248"]
    assert result.added == ["piecewise 8192 tokens"]


def test_size_that_now_fails_is_a_regression_whatever_the_threshold():
    current = _current()
    row = _size(current, "decode", 256)
    row.status, row.replay_ms, row.eager_ms, row.speedup = "failed", None, None, None
    result = compare_reports(BASELINE, current, max_regress_pct=1000.0)
    assert [(c.label, c.metric, c.note) for c in result.regressions] == [
        ("decode bs 256", "status", "ok -> failed")]


def test_different_gpu_is_refused_unless_forced():
    current = _current()
    current.environment.gpu_name = "NVIDIA A100-SXM4-80GB"
    with pytest.raises(InputError, match="GPU differs.*--force"):
        compare_reports(BASELINE, current)
    forced = compare_reports(BASELINE, current, force=True)
    assert any("GPU differs" in w for w in forced.warnings)


def test_different_model_is_refused():
    current = _current()
    current.model.config_hash = "0123456789abcdef"
    with pytest.raises(InputError, match="model differs"):
        compare_reports(BASELINE, current)


def test_changed_setting_is_a_warning_not_a_refusal():
    current = _current()
    current.settings.compiler = "inductor"
    assert any("compiler" in w for w in compare_reports(BASELINE, current).warnings)


def test_dependent_launches_on_one_side_only_are_a_warning():
    baseline, current = _current(), _current()
    assert not any("dependent" in w for w in compare_reports(baseline, current).warnings)  # not recorded
    baseline.environment.dependent_launch, current.environment.dependent_launch = True, False
    assert any("dependent launches differ" in w for w in compare_reports(baseline, current).warnings)
    current.environment.dependent_launch = True
    assert not any("dependent" in w for w in compare_reports(baseline, current).warnings)


def test_unknown_metric_is_rejected():
    with pytest.raises(InputError, match="unknown metric bogus"):
        compare_reports(BASELINE, _current(), ["bogus"])


def test_zero_baseline_growth_counts_as_infinite_percent():
    current, baseline = _current(), _current()
    _size(baseline, "decode", 16).retained_bytes = 0
    _size(current, "decode", 16).retained_bytes = 8 * MIB
    (regression,) = compare_reports(baseline, current).regressions
    assert regression.label == "decode bs 16" and math.isinf(regression.change_pct)


def test_plans_compare_graph_memory_step_time_and_kv_tokens():
    current = copy.deepcopy(PLAN)
    current.memory.kv_tokens = int(PLAN.memory.kv_tokens * 0.9)  # fewer tokens: worse
    current.decode.capture_bs = PLAN.decode.capture_bs + [192]
    result = compare_plans(PLAN, current)
    assert [c.metric for c in result.changes] == ["graph_bytes", "expected_step_ms", "kv_tokens"]
    assert [c.metric for c in result.regressions] == ["kv_tokens"]
    assert result.added == ["decode bs 192"]


def test_plans_for_different_gpus_are_refused():
    current = copy.deepcopy(PLAN)
    current.inputs.gpu = "A100-80GB"
    with pytest.raises(InputError, match="gpu differs"):
        compare_plans(PLAN, current)


def test_plans_for_different_tp_sizes_are_refused_and_older_plans_count_as_one_gpu():
    current = copy.deepcopy(PLAN)
    current.inputs.tp_size = 2
    with pytest.raises(InputError, match="tp_size differs: baseline 1, current 2"):
        compare_plans(PLAN, current)
    data = json.loads((FIXTURES / "plan-llama-3.1-8b" / "plan.json").read_text())
    del data["inputs"]["tp_size"]
    older = Plan.from_dict(data)
    assert compare_plans(older, copy.deepcopy(PLAN)).passed


def _plan_variant(edit) -> Plan:
    data = PLAN.to_dict()
    edit(data)
    return Plan.from_dict(data)


def test_plans_of_different_engines_are_refused_unless_forced():
    vllm = _plan_variant(lambda d: d["inputs"].update(engine="vllm"))
    with pytest.raises(InputError, match="engine differs: baseline sglang, current vllm"):
        compare_plans(PLAN, vllm)
    forced = compare_plans(PLAN, vllm, force=True)
    assert any("engine differs" in w for w in forced.warnings)


def test_an_incomplete_plan_is_a_failed_comparison_with_its_reason():
    stopped = _plan_variant(lambda d: d.update(status="incomplete"))
    result = compare_plans(PLAN, stopped)
    assert not result.passed
    assert [c.note for c in result.regressions] == ["the current plan is incomplete"]
