"""`cgtool report` through the CLI: renders a saved report or plan, bad input exits 2."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cli_run import piped
from typer.testing import CliRunner

from cgtool.commands.main import app

FIXTURES = Path(__file__).parent / "data" / "reports"
EXAMPLE = Path(__file__).parent.parent / "examples" / "azure-conv-first-1000.jsonl"
runner = CliRunner()


def test_report_folder_renders_beside_it_and_prints_tables(tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(FIXTURES / "h100-llama-3.1-8b-oom", folder)
    result = runner.invoke(app, ["report", str(folder)])
    assert result.exit_code == 0, result.output
    assert "decode graphs" in result.output and "Totals" in result.output
    assert "incomplete run: out of memory capturing decode bs 256" in result.output
    for name in ("sizes.csv", "report.html", "figures/decode_memory.png"):
        assert (folder / name).is_file()
        assert f"wrote {folder / name}" in result.output


def test_out_option_leaves_the_input_folder_untouched(tmp_path):
    result = runner.invoke(app, ["report", str(FIXTURES / "h100-llama-3.1-8b" / "report.json"),
                                 "--out", str(tmp_path / "html")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "html" / "report.html").is_file()
    assert sorted(p.name for p in (FIXTURES / "h100-llama-3.1-8b").iterdir()) == ["report.json"]


@pytest.fixture(scope="module")
def plan_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plan")
    result = runner.invoke(app, ["plan", "--trace", str(EXAMPLE), "--gpu", "H100-80GB",
                                 "--out", str(folder)])
    assert result.exit_code == 0, result.output
    return folder


def test_plan_folder_reprints_the_flags_and_tables(plan_folder, tmp_path):
    result = runner.invoke(app, ["report", str(plan_folder), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "Recommended flags for SGLang" in result.stdout
    assert "--mem-fraction-static" in result.stdout and "Memory on" in result.stdout
    assert (tmp_path / "plan.html").is_file()


def test_plan_folder_renders_the_layout_plan_out_wrote(plan_folder, tmp_path):
    written = sorted(p.name for p in plan_folder.iterdir())
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(plan_folder / "plan.json", copy / "plan.json")
    result = runner.invoke(app, ["report", str(copy)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in copy.iterdir()) == written
    assert not (copy / "figures").exists()


def test_missing_path_exits_2_with_one_line(tmp_path):
    result = runner.invoke(app, ["report", str(tmp_path / "nowhere")])
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {tmp_path / 'nowhere'}: no such file. Check the path."


def test_folder_without_report_exits_2(tmp_path):
    result = runner.invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2 and "neither report.json nor plan.json" in result.output


def test_unknown_major_version_exits_2_naming_the_file(tmp_path):
    text = (FIXTURES / "h100-llama-3.1-8b" / "report.json").read_text()
    (tmp_path / "report.json").write_text(text.replace('"version": "1.0"', '"version": "3.1"'))
    result = runner.invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2
    assert f"{tmp_path / 'report.json'}: version 3.1 has unknown major version 3" in result.output
    assert "Traceback" not in result.output


def test_capture_tables_piped_keep_every_cell_whole(tmp_path):
    folder = str(FIXTURES / "h100-llama-3.1-8b")
    out = piped("report", folder, "--out", str(tmp_path), timeout_s=300).stdout
    assert "…" not in out
    header = next(line for line in out.splitlines() if line.split()[:2] == ["batch", "capture"])
    assert "cumulative" in header and "non-torch" in header and "roofline" in header
    assert " 56,455.4 MiB (451,643 tokens)" in out  # the KV pool's totals row, whole


def test_plan_tables_piped_keep_every_cell_whole(tmp_path):
    out = piped("plan", "--trace", str(EXAMPLE), "--gpu", "H100-80GB", timeout_s=300).stdout
    tables = out[out.index("Plan vs"):out.index("The same sizes for")]
    assert "…" not in tables
    assert "TRT-LLM free_gpu_memory_fraction" in tables


def test_a_report_of_decode_graphs_alone_prints_the_server_gap_note(tmp_path):
    import json

    data = json.loads((FIXTURES / "h100-llama-3.1-8b" / "report.json").read_text())
    data["settings"]["kinds"] = ["decode"]
    data["sizes"] = [s for s in data["sizes"] if s["kind"] == "decode"]
    (tmp_path / "report.json").write_text(json.dumps(data))
    alone = runner.invoke(app, ["report", str(tmp_path / "report.json"), "--out", str(tmp_path / "a")])
    both = runner.invoke(app, ["report", str(FIXTURES / "h100-llama-3.1-8b" / "report.json"),
                               "--out", str(tmp_path / "b")])
    assert alone.exit_code == 0 and both.exit_code == 0, alone.output + both.output
    assert "note: decode replays were timed with no prefill graph" in alone.output
    assert "no prefill graph" not in both.output
