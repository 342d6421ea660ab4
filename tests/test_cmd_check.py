"""`cgtool check` through the CLI: exit codes 0/1/2, named sizes, markdown for CI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cgtool.commands.main import app

FIXTURES = Path(__file__).parent / "data" / "reports"
BASELINE = FIXTURES / "h100-llama-3.1-8b"
PLAN = FIXTURES / "plan-llama-3.1-8b" / "plan.json"
runner = CliRunner()


def _variant(tmp_path: Path, edit, source: Path = BASELINE / "report.json") -> Path:
    data = json.loads(source.read_text())
    edit(data)
    if data["schema"] == "cgtool.report":
        _totals_follow_sizes(data)
    folder = tmp_path / "current"
    folder.mkdir()
    (folder / source.name).write_text(json.dumps(data))
    return folder


def _totals_follow_sizes(data: dict) -> None:
    # As in a real run, the pool and free memory move with the sizes: the variant keeps the
    # memory invariants `check` demands (cgtool/documents/invariants.py) and differs only where edited.
    totals = data["totals"]
    totals["graph_pool_bytes"] = sum(s["retained_bytes"] for s in data["sizes"])
    totals["free_after_capture_bytes"] = (totals["free_before_capture_bytes"]
                                          - totals["graph_pool_bytes"] - totals["non_torch_bytes"])


def _size(data: dict, kind: str, size: int) -> dict:
    return next(s for s in data["sizes"] if s["kind"] == kind and s["size"] == size)


def _grow_retained(kind: str, size: int, factor: float):
    def edit(data: dict) -> None:
        row = _size(data, kind, size)
        row["retained_bytes"] = int(row["retained_bytes"] * factor)
    return edit


def test_same_report_passes_with_exit_0():
    result = runner.invoke(app, ["check", str(BASELINE), str(BASELINE / "report.json")])
    assert result.exit_code == 0, result.output
    assert "PASS" in result.output


def test_ten_percent_more_retained_memory_at_one_size_fails_with_exit_1_naming_it(tmp_path):
    current = _variant(tmp_path, _grow_retained("decode", 128, 1.10))
    result = runner.invoke(app, ["check", str(BASELINE), str(current), "--max-regress", "5%"])
    assert result.exit_code == 1, result.output
    assert "decode bs 128: retained_mem +10.0% (limit +5%)" in result.output


def test_looser_limit_lets_the_same_change_pass(tmp_path):
    current = _variant(tmp_path, _grow_retained("decode", 128, 1.10))
    result = runner.invoke(app, ["check", str(BASELINE), str(current), "--max-regress", "12"])
    assert result.exit_code == 0, result.output


def test_latency_metric_opt_in_uses_latency_limit(tmp_path):
    def slower(data: dict) -> None:
        _size(data, "piecewise", 512)["replay_ms"] *= 1.2

    current = _variant(tmp_path, slower)
    args = ["check", str(BASELINE), str(current), "--metric", "retained_mem,replay_ms"]
    failed = runner.invoke(app, args)
    assert failed.exit_code == 1 and "piecewise 512 tokens: replay_ms +20.0%" in failed.output
    assert runner.invoke(app, args + ["--latency-regress", "25%"]).exit_code == 0


def test_removed_and_added_sizes_are_listed(tmp_path):
    def drop_one(data: dict) -> None:
        data["sizes"] = [s for s in data["sizes"] if s["size"] != 4096]

    result = runner.invoke(app, ["check", str(BASELINE), str(_variant(tmp_path, drop_one))])
    assert "Sizes only in baseline: piecewise 4096 tokens" in result.output


def test_different_gpu_exits_2_unless_forced(tmp_path):
    def other_gpu(data: dict) -> None:
        data["environment"]["gpu_name"] = "NVIDIA A100-SXM4-80GB"

    current = _variant(tmp_path, other_gpu)
    refused = runner.invoke(app, ["check", str(BASELINE), str(current)])
    assert refused.exit_code == 2
    assert "refusing to compare: GPU differs" in refused.output and "--force" in refused.output
    forced = runner.invoke(app, ["check", str(BASELINE), str(current), "--force"])
    assert forced.exit_code == 0 and "compared anyway" in forced.output


def test_markdown_file_holds_the_verdict_and_the_regressed_size(tmp_path):
    current = _variant(tmp_path, _grow_retained("piecewise", 1024, 1.5))
    summary = tmp_path / "summary.md"
    result = runner.invoke(app, ["check", str(BASELINE), str(current), "--markdown", str(summary)])
    assert result.exit_code == 1
    text = summary.read_text()
    assert text.startswith("## cgtool check: **FAIL**")
    assert "| piecewise 1024 tokens | retained_mem | 20.0 MiB | 30.0 MiB | +50.0% | REGRESSED |" in text
    assert "<details>" in text


def test_markdown_dash_prints_markdown_instead_of_the_table():
    result = runner.invoke(app, ["check", str(BASELINE), str(BASELINE), "--markdown", "-"])
    assert result.exit_code == 0
    assert result.output.startswith("## cgtool check: **PASS**")


@pytest.mark.parametrize("args", [["--max-regress", "lots"], ["--latency-regress", "-3%"],
                                  ["--metric", "bogus"]])
def test_bad_options_exit_2_with_one_line(args):
    result = runner.invoke(app, ["check", str(BASELINE), str(BASELINE)] + args)
    assert result.exit_code == 2
    assert result.output.startswith("error:") and len(result.output.strip().splitlines()) == 1


def test_truncated_current_report_exits_2_naming_the_file(tmp_path):
    broken = tmp_path / "report.json"
    broken.write_text((BASELINE / "report.json").read_text()[:3000])
    result = runner.invoke(app, ["check", str(BASELINE), str(broken)])
    assert result.exit_code == 2
    assert f"{broken}: not valid JSON" in result.output
    assert "Traceback" not in result.output


def test_report_against_plan_exits_2():
    result = runner.invoke(app, ["check", str(BASELINE), str(PLAN)])
    assert result.exit_code == 2 and "cannot compare a capture report with a plan" in result.output


def test_two_plans_compare_on_plan_figures(tmp_path):
    def more_graph_memory(data: dict) -> None:
        data["memory"]["graph_bytes"] = int(data["memory"]["graph_bytes"] * 1.2)

    current = _variant(tmp_path, more_graph_memory, PLAN)
    result = runner.invoke(app, ["check", str(PLAN), str(current)])
    assert result.exit_code == 1
    assert "plan: graph_bytes +20.0%" in result.output


# Fuzzing the CLI end (issue 7): 80 generated cases of corrupted current reports.
_BASE = json.loads((BASELINE / "report.json").read_text())


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(min_value=0, max_value=2000), size_index=st.integers(0, 41),
       field=st.sampled_from(["retained_bytes", "size", "kind", "status", "replay_ms"]),
       value=st.none() | st.booleans() | st.integers(-(10**20), 10**20) | st.text(max_size=8))
def test_fuzz_corrupt_current_report_exits_2_with_one_line_or_compares(
        tmp_path, cut, size_index, field, value):
    data = json.loads(json.dumps(_BASE))
    data["sizes"][size_index][field] = value
    path = tmp_path / "report.json"
    text = json.dumps(data)
    path.write_text(text[: len(text) - cut] if cut % 3 == 0 else text)
    result = runner.invoke(app, ["check", str(BASELINE), str(path)])
    assert result.exit_code in (0, 1, 2), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    if result.exit_code == 2:
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {path}: "), result.output


def test_report_whose_peak_is_below_what_it_retained_is_refused_with_exit_2(tmp_path):
    def contradict(data: dict) -> None:
        row = _size(data, "piecewise", 4096)
        row["peak_bytes"] = row["retained_bytes"] // 2

    current = _variant(tmp_path, contradict)
    result = runner.invoke(app, ["check", str(BASELINE), str(current)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"error: {current / 'report.json'}: memory figures contradict each other: "
        "piecewise 4096 tokens: peak >= retained >= 0 fails")


def test_baseline_whose_free_memory_rose_during_capture_is_refused_naming_it(tmp_path):
    data = json.loads((BASELINE / "report.json").read_text())
    totals = data["totals"]
    totals["free_after_capture_bytes"] = totals["free_before_capture_bytes"] + (670 << 20)
    baseline = tmp_path / "report.json"
    baseline.write_text(json.dumps(data))
    result = runner.invoke(app, ["check", str(baseline), str(BASELINE)])
    assert result.exit_code == 2
    assert result.output.startswith(f"error: {baseline}: memory figures contradict each other: "
                                    "total: free drop = pool + non-torch + static buffers + other torch fails (free fell -670 MiB")


def test_markdown_to_an_unwritable_path_is_one_line_and_exit_2():
    result = runner.invoke(app, ["check", str(BASELINE), str(BASELINE), "--markdown",
                                 "/proc/cgtool-nowhere/x.md"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: /proc/cgtool-nowhere/x.md: ")
    assert "Traceback" not in result.output and "PASS" not in result.output


def test_negative_retained_bytes_are_refused_naming_the_field(tmp_path):
    def negative(data: dict) -> None:
        _size(data, "decode", 1)["retained_bytes"] = -5

    current = _variant(tmp_path, negative)
    result = runner.invoke(app, ["check", str(BASELINE), str(current)])
    assert result.exit_code == 2
    assert "retained_bytes' is -5, below 0 bytes" in result.stderr


def test_a_change_under_the_floor_says_so_beside_ok(tmp_path):
    # decode bs 1 retains 6 MiB: +10% is 0.6 MiB, over the 5% limit but under the 1 MiB floor.
    def grow_a_little(data: dict) -> None:
        row = _size(data, "decode", 1)
        row["retained_bytes"] = int(row["retained_bytes"] * 1.1)

    current = _variant(tmp_path, grow_a_little)
    result = runner.invoke(app, ["check", str(BASELINE), str(current)])
    assert result.exit_code == 0, result.output
    assert "retained_mem +5% and over 1.0 MiB" in result.stdout
    assert "ok (under 1.0 MiB)" in result.stdout


def test_plans_from_different_traces_are_compared_with_a_warning(tmp_path):
    def other_trace(data: dict) -> None:
        data["inputs"]["trace"] = "other-trace.jsonl"

    current = _variant(tmp_path, other_trace, PLAN)
    result = runner.invoke(app, ["check", str(PLAN), str(current)])
    assert result.exit_code == 0, result.output
    assert "warning: the plans come from different traces" in result.stdout
    assert "other-trace.jsonl" in result.stdout


def test_a_large_decrease_is_plain_ok(tmp_path):
    current = _variant(tmp_path, _grow_retained("decode", 1, 0.5))
    result = runner.invoke(app, ["check", str(BASELINE), str(current)])
    assert result.exit_code == 0, result.output
    assert "-50.0%" in result.stdout and "under 1.0 MiB" not in result.stdout


def test_a_regression_in_csv_still_exits_1_with_the_verdict_on_stderr(tmp_path):
    def more_graph_memory(data: dict) -> None:
        data["memory"]["graph_bytes"] = int(data["memory"]["graph_bytes"] * 1.2)

    current = _variant(tmp_path, more_graph_memory, PLAN)
    result = runner.invoke(app, ["check", str(PLAN), str(current), "--format", "csv"])
    assert result.exit_code == 1
    assert "FAIL" in result.stderr and "plan: graph_bytes +20.0%" in result.stderr
    assert "FAIL" not in result.stdout and "REGRESSED" in result.stdout


def test_plans_for_different_engines_are_refused_with_one_line_and_exit_2(tmp_path):
    def for_vllm(data: dict) -> None:
        data["inputs"]["engine"] = "vllm"

    current = _variant(tmp_path, for_vllm, PLAN)
    result = runner.invoke(app, ["check", str(PLAN), str(current)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "engine differs: baseline sglang, current vllm" in lines[0]
    assert "Traceback" not in result.output


@pytest.mark.parametrize("side", ["baseline", "current"])
def test_an_incomplete_plan_on_either_side_fails_naming_it(tmp_path, side):
    def stopped(data: dict) -> None:
        data["status"] = "incomplete"

    incomplete = _variant(tmp_path, stopped, PLAN)
    pair = [str(incomplete), str(PLAN)] if side == "baseline" else [str(PLAN), str(incomplete)]
    result = runner.invoke(app, ["check", *pair])
    assert result.exit_code == 1, result.output
    assert f"the {side} plan is incomplete" in result.stdout
    assert "PASS" not in result.stdout
