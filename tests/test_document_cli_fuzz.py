"""Documents with one odd number, read by the commands that use them: no traceback.

The readers' own fuzz tests (test_results.py) stop at loading. These go on to what `check` and
`plan --profile` / `--compare-plan` compute from the figures, where a size of 2**53 once asked
numpy for 64 PiB and a 401-digit integer reached float(). 60 examples a document, each run
through the commands that read it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from fuzzing import fuzz, fuzz_file
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from cgtool.commands.main import app

DATA = Path(__file__).parent / "data"
REPORT = DATA / "reports" / "h100-llama-3.1-8b" / "report.json"
PLAN = DATA / "reports" / "plan-llama-3.1-8b" / "plan.json"
TRACE = '{"arrival": 0, "input_len": 40, "output_len": 3}\n{"arrival": 0.5, "input_len": 20, "output_len": 2}\n'
ODD_NUMBERS = st.sampled_from([0, -1, 1, 3, 0.5, -0.5, 1e-300, 1e300, -1e300, 65_536, 2**40, 2**53, 10**400])


def _numeric_leaves(value: object, prefix: tuple = ()) -> list[tuple]:
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _numeric_leaves(v, (*prefix, k))]
    if isinstance(value, list):  # the first few items of a list stand for the rest
        return [p for i, v in enumerate(value[:3]) for p in _numeric_leaves(v, (*prefix, i))]
    return [prefix] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


def _mutated(base: dict, path: tuple, value: object) -> dict:
    data = copy.deepcopy(base)
    target = data
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return data


def _no_traceback(args: list[str]) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), (args, result.exception)
    assert result.exit_code in (0, 1, 2), (args, result.exit_code)


_REPORT = json.loads(REPORT.read_text())
_PLAN = json.loads(PLAN.read_text())


@fuzz(60)
@given(st.sampled_from(_numeric_leaves(_REPORT)), ODD_NUMBERS)
def test_a_report_with_an_odd_number_is_read_or_refused_by_check_and_plan(path, value):
    report = fuzz_file(json.dumps(_mutated(_REPORT, path, value)), "report.json")
    trace = fuzz_file(TRACE, "trace.jsonl")
    _no_traceback(["check", str(report), str(REPORT)])
    _no_traceback(["plan", "--trace", str(trace), "--profile", str(report), "--load", "1"])


@fuzz(60)
@given(st.sampled_from(_numeric_leaves(_PLAN)), ODD_NUMBERS)
def test_a_plan_with_an_odd_number_is_read_or_refused_by_compare_plan_and_check(path, value):
    plan = fuzz_file(json.dumps(_mutated(_PLAN, path, value)), "plan.json")
    trace = fuzz_file(TRACE, "trace.jsonl")
    _no_traceback(["plan", "--trace", str(trace), "--compare-plan", str(plan), "--load", "1"])
    _no_traceback(["check", str(plan), str(PLAN)])
