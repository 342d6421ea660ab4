import json

import pytest
import torch
from typer.testing import CliRunner
from verify_fixture import PLAN, synthetic_result

from cgtool.commands.main import app
from cgtool.verify.result import write_verify

runner = CliRunner()
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")


def _one_error_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert "Traceback" not in result.output
    return lines[0]


@no_gpu
def test_no_gpu_is_one_line_and_exit_2():
    result = runner.invoke(app, ["verify", "--plan", str(PLAN), "--steps", "50"])
    assert result.exit_code == 2
    assert "needs a CUDA GPU" in _one_error_line(result)


def test_a_missing_plan_is_one_line_and_exit_2_before_the_gpu_check(tmp_path):
    result = runner.invoke(app, ["verify", "--plan", str(tmp_path / "nope.json")])
    assert result.exit_code == 2
    assert "nope.json: no such file" in _one_error_line(result)


def test_a_capture_report_instead_of_a_plan_is_refused():
    report = PLAN.parent.parent / "h100-llama-3.1-8b" / "report.json"
    result = runner.invoke(app, ["verify", "--plan", str(report)])
    assert result.exit_code == 2
    assert "not a plan" in _one_error_line(result)


def test_a_missing_trace_is_named(tmp_path):
    result = runner.invoke(app, ["verify", "--plan", str(PLAN), "--trace", str(tmp_path / "t.jsonl")])
    assert result.exit_code == 2
    assert "--trace" in _one_error_line(result)


@pytest.mark.parametrize("flag,value", [("--repeats", "1"), ("--steps", "0"), ("--mem-fraction-static", "1.5")])
def test_bad_numbers_are_named(flag, value):
    result = runner.invoke(app, ["verify", "--plan", str(PLAN), flag, value])
    assert result.exit_code == 2
    assert flag in _one_error_line(result)


def test_plan_accepts_a_verify_json_as_profile(tmp_path):
    write_verify(synthetic_result(), tmp_path / "verify.json")
    trace = PLAN.parents[4] / "examples" / "azure-conv-first-1000.jsonl"
    result = runner.invoke(app, ["plan", "--trace", str(trace), "--gpu", "H100-80GB",
                                 "--profile", str(tmp_path / "verify.json"), "--json"])
    assert result.exit_code == 0, result.output
    assert '"profile": "' in result.output and "verify.json" in result.output


@no_gpu
def test_capture_with_a_plan_says_it_uses_the_plans_fraction():
    fraction = json.loads(PLAN.read_text())["memory"]["mem_fraction_static"]
    result = runner.invoke(app, ["capture", "--plan", str(PLAN)])
    assert f"--mem-fraction-static {fraction:g} from the plan" in result.output
    assert result.exit_code == 2  # and then no GPU


@no_gpu
def test_capture_flag_overrides_the_plans_fraction():
    result = runner.invoke(app, ["capture", "--plan", str(PLAN), "--mem-fraction-static", "0.7"])
    assert "--mem-fraction-static 0.7 from the flag" in result.output
