"""The CLI contract: for every command and every option that takes a value, a bad value gives
exit 2 and one line on stderr, never a traceback or a box."""

import atexit
import shutil
import tempfile
from pathlib import Path

import pytest
import typer.main
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.core import TyperOption
from typer.testing import CliRunner

from cgtool.commands.main import app

runner = CliRunner()
ROOT = Path(__file__).parent.parent
EXAMPLE = ROOT / "examples" / "azure-conv-first-1000.jsonl"
REPORT = ROOT / "tests" / "data" / "reports" / "h100-llama-3.1-8b"
NOWHERE = "/proc/cgtool-nowhere/x"  # neither readable nor creatable, even for root
# `trace convert` needs somewhere to write: a folder of this test session, not a fixed /tmp
# name that another checkout's run (or another user) may hold.
_SCRATCH = tempfile.mkdtemp(prefix="cgtool-contract-")
atexit.register(shutil.rmtree, _SCRATCH, ignore_errors=True)

# The smallest valid command line of each command; one option at a time is then spoiled.
VALID = {
    ("plan",): ["--trace", EXAMPLE, "--gpu", "H100-80GB"],
    ("capture",): [],
    ("verify",): ["--plan", ROOT / "tests" / "data" / "reports" / "plan-llama-3.1-8b"],
    ("check",): [REPORT, REPORT],
    ("schedule",): [],
    ("report",): [REPORT],
    ("models",): [],
    ("trace", "convert"): [EXAMPLE, "--format", "cgtool", "--out", Path(_SCRATCH) / "converted.jsonl"],
    ("trace", "stats"): [EXAMPLE],
}


def _commands():
    root = typer.main.get_command(app)
    for path in VALID:
        command = root
        for name in path:
            command = command.commands[name]
        yield path, command


def _valued_options():
    for path, command in _commands():
        for param in command.params:
            if isinstance(param, TyperOption) and not param.is_flag and param.name != "help":
                yield path, param


def _value_kind(param: TyperOption) -> tuple[type | None, bool]:
    """(the option's value type when numeric, whether it is a choice), from Typer's own
    descriptor or, in the older Typer releases built on click (the GPU machine's), click's."""
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is not None:
        return descriptor.annotation, descriptor.is_choice
    import click

    kind = param.type
    number = int if isinstance(kind, click.types.IntParamType) else (
        float if isinstance(kind, click.types.FloatParamType) else None)
    return number, isinstance(kind, click.Choice)


def _bad_value(param: TyperOption) -> str:
    if getattr(param, "min", None) is not None:
        return str(param.min - 1)
    kind, is_choice = _value_kind(param)
    if kind in (int, float):
        return "not-a-number"
    if is_choice:
        return "bogus"
    return NOWHERE


def _long_flag(param: TyperOption) -> str:
    return max((o for o in param.opts if o.startswith("--")), key=len)


def _invoke(path, flag: str, value: str):
    args = [*path, *map(str, VALID[path]), flag, value]
    return runner.invoke(app, args)


def _assert_one_line_exit_2(result, flag: str) -> None:
    assert result.exit_code == 2, (flag, result.output)
    # Progress lines ("reading FILE") may come first; the error is one line, and the last.
    lines = result.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], (flag, result.stderr)
    # The bad value's own reason: on a machine without a GPU, "needs a CUDA GPU" also exits 2,
    # and capture --out, verify --out and verify --format passed on it alone.
    assert "CUDA GPU" not in errors[0], (flag, errors[0])
    assert "Traceback" not in result.output and "╭" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


CASES = [(path, param) for path, param in _valued_options()]


def test_every_command_has_options_under_contract():
    assert {path for path, _ in CASES} >= {("plan",), ("capture",), ("verify",), ("check",), ("schedule",),
                                          ("report",), ("trace", "convert"), ("trace", "stats")}


@pytest.mark.parametrize(("path", "param"), CASES,
                         ids=[f"{' '.join(p)} {_long_flag(o)}" for p, o in CASES])
def test_a_bad_value_is_one_line_and_exit_2(path, param, tmp_path):
    flag = _long_flag(param)
    _assert_one_line_exit_2(_invoke(path, flag, _bad_value(param)), flag)


RANGED = [(path, param) for path, param in CASES if getattr(param, "min", None) is not None]
INTEGERS = [(path, param) for path, param in CASES if _value_kind(param)[0] is int]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(RANGED), below=st.integers(min_value=1, max_value=10**12))
def test_generated_values_below_a_minimum_are_refused(case, below):
    path, param = case
    flag = _long_flag(param)
    _assert_one_line_exit_2(_invoke(path, flag, str(param.min - below)), flag)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(INTEGERS),
       text=st.text(min_size=1, max_size=12).filter(lambda t: not t.strip().lstrip("+-").isdigit()
                                                   and not t.startswith("-")))
def test_generated_text_for_a_whole_number_is_refused(case, text):
    path, param = case
    flag = _long_flag(param)
    _assert_one_line_exit_2(_invoke(path, flag, text), flag)
