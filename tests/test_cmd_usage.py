"""Usage errors are one line naming the flag and the remedy; help shows no Typer metavar noise."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cgtool.commands.main import app
from cgtool.commands.usage import given_value, suggestions

runner = CliRunner()
EXAMPLE = Path(__file__).parent.parent / "examples" / "azure-conv-first-1000.jsonl"


def _one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "╭" not in result.output and "Traceback" not in result.output
    return lines[0]


@pytest.mark.parametrize(("args", "expected"), [
    (["plan", "--trace", EXAMPLE, "--budget-graphs", "-3"], "--budget-graphs must be ≥ 0 (got -3)"),
    (["plan", "--trace", EXAMPLE, "--chunked-prefill-size", "0"],
     "--chunked-prefill-size must be ≥ 1 (got 0)"),
    (["plan", "--trace", EXAMPLE, "--chunked-prefill-size=0"],
     "--chunked-prefill-size must be ≥ 1 (got 0)"),
    (["capture", "--kind", "bogus"], "--kind: 'bogus' is not one of 'decode', 'piecewise', 'both'"),
    (["trace", "convert", "x", "--format", "azure", "-o", "y", "--limit", "0"],
     "--limit must be ≥ 1 (got 0)"),
    (["plan", "--trace", EXAMPLE, "--tp", "x"], "--tp takes a whole number (got x)"),
    (["plan"], "missing option --trace"),
    (["check", "a"], "missing argument CURRENT"),
    (["plan", "--out"], "--out needs a value"),
])
def test_usage_error_is_one_line_naming_the_flag(args, expected):
    line = _one_error_line(runner.invoke(app, [str(a) for a in args]))
    assert expected in line


def test_usage_error_points_to_the_subcommand_help():
    line = _one_error_line(runner.invoke(app, ["trace", "convert", "x", "-f", "azure", "-o", "y",
                                               "--limit", "0"]))
    assert line.endswith("See `cgtool trace convert --help`.")


def test_unknown_option_suggests_only_close_names():
    line = _one_error_line(runner.invoke(app, ["plan", "--budget-graph", "3"]))
    assert "unknown option --budget-graph; did you mean --budget-graphs" in line
    line = _one_error_line(runner.invoke(app, ["plan", "--bogus"]))
    assert "unknown option --bogus." in line and "--gpu" not in line and "--out" not in line


def test_suggestions_compare_names_without_dashes():
    assert suggestions("--bogus", ["--gpu", "--out", "--json"]) == []
    assert suggestions("--modle", ["--model", "--tp"]) == ["--model"]


def test_given_value_reads_both_spellings_and_the_last_use():
    assert given_value(["--tp", "1", "--tp=4"], "--tp") == "4"
    assert given_value(["--tp", "2"], "--tp") == "2"
    assert given_value(["--tp"], "--tp") is None


def test_unknown_command_lists_the_commands():
    line = _one_error_line(runner.invoke(app, ["nosuch"]))
    assert "unknown command 'nosuch'" in line and "plan" in line and "capture" in line


@pytest.mark.parametrize("command", [["plan"], ["capture"], ["verify"], ["check"], ["schedule"], ["report"],
                                     ["models"], ["trace", "convert"], ["trace", "stats"], []])
def test_help_has_no_bool_metavar_or_braced_arguments(command):
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.output
    usage = next(line for line in result.output.splitlines() if "Usage:" in line)
    assert "{" not in usage


def test_check_usage_names_its_arguments_in_capitals():
    result = runner.invoke(app, ["check", "--help"])
    assert "cgtool check [OPTIONS] BASELINE CURRENT" in result.output


def test_installed_script_prints_one_line_without_a_terminal():
    # The console script itself, stderr piped: no box, one line, exit 2.
    env = {**os.environ, "CGTOOL_DEBUG": ""}
    proc = subprocess.run([sys.executable, "-m", "cgtool.commands.entry", "plan", "--trace",
                           str(EXAMPLE), "--budget-graphs", "-3"],
                          check=False, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: --budget-graphs must be ≥ 0 (got -3). See `cgtool plan --help`."]


@pytest.mark.parametrize("command", [["capture"], ["plan"], ["verify"]])
def test_help_piped_to_a_log_cuts_no_flag_or_default(command):
    """Rich falls back to 80 columns without a terminal, and cut `--mem-fraction-static` to
    `--mem-fraction-s…` in `cgtool capture --help | cat`."""
    env_free = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TERMINAL_WIDTH")}
    proc = subprocess.run([sys.executable, "-m", "cgtool.commands.entry", *command, "--help"],
                          capture_output=True, text=True, env=env_free, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "…" not in proc.stdout
    assert "--mem-fraction-static" in proc.stdout


@pytest.mark.parametrize("args", [[], ["trace"]])
def test_a_group_without_a_command_prints_its_help_and_no_error(args):
    # It printed the help and then "error: ." with exit 2.
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "Usage: cgtool" in result.stdout and "Commands" in result.stdout
    assert "error" not in result.output
