"""`--format table|csv|json` on the commands that print tables (models, schedule, check,
report): CSV and JSON carry the rows the table shows, and nothing else on stdout."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from cli_run import piped
from table_formats import as_tuples, csv_tables, json_tables
from typer.testing import CliRunner

from cgtool.commands.main import app
from cgtool.commands.models import ARCHITECTURES_TITLE
from cgtool.documents.compare import compare_plans, compare_reports
from cgtool.documents.plan_document import Plan
from cgtool.documents.results import load_document
from cgtool.reports.render import printed_tables
from cgtool.reports.schedule_view import schedule_rows
from cgtool.reports.tables import TableData, comparison_rows, models_rows, vision_models_rows
from cgtool.specs.config import SUPPORTED_ARCHITECTURES, load_preset, preset_names
from cgtool.specs.vision import load_vision_preset, vision_preset_names

FIXTURES = Path(__file__).parent / "data" / "reports"
REPORT = FIXTURES / "h100-llama-3.1-8b"
PLAN = FIXTURES / "plan-llama-3.1-8b"
runner = CliRunner()


def _models_tables() -> list[TableData]:
    architectures = [[name] for name in SUPPORTED_ARCHITECTURES]
    vision = vision_models_rows([load_vision_preset(name) for name in vision_preset_names()])
    return [models_rows([load_preset(name) for name in preset_names()]), vision,
            TableData(ARCHITECTURES_TITLE, ["architecture"], architectures)]


def _check_tables(folder: Path) -> list[TableData]:
    document = load_document(folder)
    if isinstance(document, Plan):
        return [comparison_rows(compare_plans(document, document))]
    return [comparison_rows(compare_reports(document, document))]


@pytest.fixture
def report_copy(tmp_path: Path) -> Path:
    # `report` writes its figures beside the input: never into the fixtures.
    shutil.copytree(REPORT, tmp_path / "run")
    return tmp_path / "run"


def _commands(report_copy: Path) -> dict[str, tuple[list[str], list[TableData]]]:
    return {
        "models": (["models"], _models_tables()),
        "check": (["check", str(REPORT), str(REPORT)], _check_tables(REPORT)),
        "check plans": (["check", str(PLAN), str(PLAN)], _check_tables(PLAN)),
        "report": (["report", str(report_copy)], printed_tables(load_document(REPORT))),
    }


@pytest.mark.parametrize("name", ["models", "check", "check plans", "report"])
@pytest.mark.parametrize(("output", "read"), [("csv", csv_tables), ("json", json_tables)])
def test_csv_and_json_carry_the_tables_rows(name, output, read, report_copy):
    args, expected = _commands(report_copy)[name]
    result = runner.invoke(app, [*args, "--format", output])
    assert result.exit_code == 0, result.output
    assert read(result.stdout) == as_tuples(expected, output)


@pytest.mark.parametrize("name", ["models", "check", "report"])
def test_the_table_shows_as_many_rows_as_csv_carries(name, report_copy):
    args, expected = _commands(report_copy)[name]
    table = runner.invoke(app, args).stdout
    shown = table.splitlines()
    if name == "models":  # the table prints the architectures as one line, not a table
        assert shown[-1] == f"{ARCHITECTURES_TITLE}: {', '.join(SUPPORTED_ARCHITECTURES)}"
        expected = expected[:2]
    for data in expected:
        assert data.title in table
        # every row's first cell starts one line of the table (each cell read whole)
        firsts = [row[0] for row in data.rows]
        assert sum(1 for line in shown if line.strip().split("  ")[0] in firsts) >= len(firsts)


def test_check_csv_sends_the_verdict_to_stderr():
    result = runner.invoke(app, ["check", str(REPORT), str(REPORT), "--format", "csv"])
    assert "PASS" in result.stderr and "PASS" not in result.stdout


def test_report_csv_lists_written_files_on_stderr(report_copy):
    result = runner.invoke(app, ["report", str(report_copy), "--format", "csv"])
    assert f"wrote {report_copy / 'report.html'}" in result.stderr
    assert "wrote" not in result.stdout


def test_report_json_includes_the_phases_when_the_run_recorded_them(report_copy):
    data = json.loads((report_copy / "report.json").read_text())
    data["totals"]["phase_s"] = {"load": 1.0, "capture": 3.0}
    (report_copy / "report.json").write_text(json.dumps(data))
    result = runner.invoke(app, ["report", str(report_copy), "--format", "json"])
    tables = {title: rows for title, _, rows in json_tables(result.stdout)}
    assert [row[0] for row in tables["Phases"]] == ["load", "capture"]


def test_schedule_csv_is_the_table_and_json_is_the_schedule_as_with_json():
    table = runner.invoke(app, ["schedule", "--engine", "vllm"]).stdout
    [(title, columns, rows)] = csv_tables(runner.invoke(
        app, ["schedule", "--engine", "vllm", "--format", "csv"]).stdout)
    assert title in table and columns == ["", "value"]
    as_format = runner.invoke(app, ["schedule", "--engine", "vllm", "--format", "json"]).stdout
    as_switch = runner.invoke(app, ["schedule", "--engine", "vllm", "--json"]).stdout
    assert json.loads(as_format) == json.loads(as_switch)
    assert all(row[0] in table for row in rows)
    assert rows == as_tuples([schedule_rows(json.loads(as_format))], "csv")[0][2]
    assert rows[0][1] == " ".join(map(str, json.loads(as_format)["decode_bs"]))  # every size
    assert runner.invoke(app, ["schedule", "--json", "--format", "json"]).exit_code == 0


def test_schedule_json_switch_and_another_format_is_one_line_exit_2():
    result = runner.invoke(app, ["schedule", "--json", "--format", "csv"])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "error: --json and --format csv ask for different outputs. Give one of them."]


def test_check_markdown_to_stdout_with_csv_is_one_line_exit_2():
    result = runner.invoke(app, ["check", str(REPORT), str(REPORT), "--markdown", "-",
                                 "--format", "json"])
    assert result.exit_code == 2 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args", [["models"], ["schedule"], ["check", str(REPORT), str(REPORT)],
                                  ["report", str(REPORT)]])
def test_an_unknown_format_is_one_line_and_exit_2(args):
    result = runner.invoke(app, [*args, "--format", "xml"])
    assert result.exit_code == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: --format: 'xml' is not one of 'table', 'csv', 'json'")


def test_piped_csv_has_no_rich_markup_or_cut_cells():
    proc = piped("check", str(REPORT), str(REPORT), "--format", "csv")
    assert csv_tables(proc.stdout) == as_tuples(_check_tables(REPORT), "csv")
    assert "PASS" in proc.stderr


def _plan_tables_as(output: str, tmp_path: Path) -> dict[str, tuple[list, list]]:
    folder = tmp_path / "plan"
    folder.mkdir()
    shutil.copy(NEW_PLAN, folder / "plan.json")
    result = runner.invoke(app, ["report", str(folder), "--format", output])
    assert result.exit_code == 0, result.output
    read = csv_tables if output == "csv" else json_tables
    return {title: (columns, rows) for title, columns, rows in read(result.stdout)}


NEW_PLAN = Path(__file__).resolve().parents[1] / "tests" / "data" / "plans" / "plan-1.3-example.json"


def test_plan_csv_carries_every_capture_size_and_plain_numbers(tmp_path):
    plan = json.loads(NEW_PLAN.read_text())
    tables = _plan_tables_as("csv", tmp_path)
    sizes = {row[0]: row[1:] for row in tables["Capture sizes"][1]}
    decode = plan["decode"]["capture_bs"]
    assert len(decode) > 16  # more than the display shows before its "..."
    assert sizes["decode batch sizes"][0] == " ".join(map(str, decode))
    comparison = next(rows for title, (_, rows) in tables.items() if title.startswith("Plan vs"))
    figures = {row[0]: row[1:] for row in comparison}
    assert float(figures["expected_step_ms"][0]) == pytest.approx(plan["comparison"][0]["expected_step_ms"])
    assert int(figures["kv_tokens"][0]) == plan["comparison"][0]["kv_tokens"]
    every_cell = [c for _, rows in tables.values() for row in rows for c in row]
    assert not [c for c in every_cell if re.fullmatch(r"[\d.,]+ (ms|s|GiB|MiB)|\d{1,3}(,\d{3})+|[+-]?[\d.]+%", c)]


def test_plan_json_carries_lists_and_numbers(tmp_path):
    plan = json.loads(NEW_PLAN.read_text())
    tables = _plan_tables_as("json", tmp_path)
    rows = {row[0]: row[1:] for row in tables["Capture sizes"][1]}
    assert rows["piecewise tokens"][0] == plan["piecewise"]["capture_num_tokens"]
    loads = tables["Simulation per load"]
    assert loads[0][:2] == ["load", "duration_s"]
    assert [row[0] for row in loads[1]] == [1.0, 2.0]


def test_check_json_carries_numbers_and_the_unit_a_table_spells_out():
    result = runner.invoke(app, ["check", str(REPORT), str(REPORT), "--format", "json"])
    [(_, columns, rows)] = json_tables(result.stdout)
    assert columns == ["size", "metric", "baseline", "current", "change_pct", "verdict", "unit"]
    total = next(row for row in rows if row[0] == "total")
    assert isinstance(total[2], int) and total[4] == 0.0 and total[6] == "bytes"
    assert "unit" not in runner.invoke(app, ["check", str(REPORT), str(REPORT)]).stdout.split()


def test_capture_report_csv_carries_bytes_under_report_json_names(report_copy):
    result = runner.invoke(app, ["report", str(report_copy), "--format", "csv"])
    _title, columns, rows = csv_tables(result.stdout)[0]
    assert columns[:4] == ["size", "status", "capture_s", "retained_bytes"]
    report = json.loads((report_copy / "report.json").read_text())
    first = next(s for s in report["sizes"] if s["kind"] == "decode")
    assert rows[0][3] == str(first["retained_bytes"])
