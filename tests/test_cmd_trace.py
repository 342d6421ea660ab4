"""`cgtool trace convert` and `cgtool trace stats` through the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cgtool.commands.main import app
from cgtool.traces.trace import RequestTrace, read_trace
from cgtool.units import counted

runner = CliRunner()
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "azure-conv-first-1000.jsonl"
AZURE_REAL = (
    Path(__file__).resolve().parents[2] / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"
)

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.0,374,44
2023-11-16 18:15:47.5,3000,100
2023-11-16 18:15:49.0,1500,600
2023-11-16 18:15:52.0,0,5
"""


@pytest.fixture
def azure_csv(tmp_path):
    source = tmp_path / "azure.csv"
    source.write_text(AZURE)
    return source


def _convert_azure(source: Path, out: Path, *extra: str):
    return runner.invoke(app, ["trace", "convert", str(source), "-f", "azure", "-o", str(out), *extra])


def test_convert_writes_a_trace_and_says_what_it_left_out(tmp_path, azure_csv):
    out = tmp_path / "trace.jsonl"
    result = runner.invoke(
        app, ["trace", "convert", str(azure_csv), "--format", "azure", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "Read 4 azure records" in result.stdout
    assert "wrote 3 requests" in result.stdout and "1 empty prompt" in result.stdout
    trace = read_trace(out)
    assert isinstance(trace, RequestTrace)
    assert trace.input_len.tolist() == [374, 3000, 1500]
    assert trace.arrival_s.tolist() == [0.0, 1.5, 3.0]


def test_convert_drops_requests_longer_than_the_models_context(tmp_path, azure_csv):
    out = tmp_path / "trace.jsonl"
    # the tiny preset has a 2,048-token context: 3,000 and 1,500 + 600 do not fit
    result = _convert_azure(azure_csv, out, "--model", "tiny")
    assert result.exit_code == 0, result.output
    assert "dropped 2 longer than tiny's context (2,048 tokens)" in result.stdout
    assert read_trace(out).input_len.tolist() == [374]


def test_convert_limit_keeps_the_earliest_requests(tmp_path, azure_csv):
    out = tmp_path / "trace.jsonl"
    result = _convert_azure(azure_csv, out, "--limit", "2")
    assert result.exit_code == 0, result.output
    assert read_trace(out).input_len.tolist() == [374, 3000]


def test_convert_sglang_log_writes_a_batch_trace(tmp_path):
    source = tmp_path / "server.log"
    source.write_text(
        "[t] Prefill batch. #new-seq: 2, #new-token: 640, #cached-token: 0, token usage: 0.01, #running-req: 0, #queue-req: 0,\n"
        "[t] Decode batch. #running-req: 2, #token: 700, token usage: 0.01, cuda graph: True, gen throughput (token/s): 90.00, #queue-req: 0,\n"
    )
    out = tmp_path / "batches.jsonl"
    result = runner.invoke(
        app, ["trace", "convert", str(source), "-f", "sglang-log", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert out.read_text().splitlines() == [
        '{"mode": "decode", "batch_size": 2, "count": 40}',
        '{"mode": "extend", "num_tokens": 640}',
    ]
    stats = runner.invoke(app, ["trace", "stats", str(out), "--json"])
    data = json.loads(stats.stdout)
    assert data["kind"] == "batches" and data["num_steps"] == 41


def test_stats_prints_counts_and_percentiles(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"arrival": i * 0.5, "input_len": 100 * (i + 1), "output_len": 10}) + "\n"
            for i in range(10)
        )
    )
    result = runner.invoke(app, ["trace", "stats", str(trace)])
    assert result.exit_code == 0, result.output
    assert "10 requests over 0.1 min, 2.00 req/s" in result.stdout
    assert "1,000" in result.stdout  # the longest prompt
    as_json = json.loads(runner.invoke(app, ["trace", "stats", str(trace), "--json"]).stdout)
    assert as_json["num_requests"] == 10
    assert as_json["input_len"]["p"]["50"] == 500
    assert as_json["duration_s"] == 4.5


def test_stats_reports_requests_over_the_context_as_dropped(tmp_path):
    trace = tmp_path / "t.jsonl"
    lines = [
        {"arrival": 0, "input_len": 4000, "output_len": 1},
        {"arrival": 1, "input_len": 10, "output_len": 1},
    ]
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = runner.invoke(app, ["trace", "stats", str(trace), "--context-len", "2048", "--json"])
    data = json.loads(result.stdout)
    assert (
        data["dropped_over_context"] == 1
        and data["num_requests"] == 1
        and data["context_len"] == 2048
    )


def test_stats_reads_a_source_format_directly(azure_csv):
    data = json.loads(
        runner.invoke(app, ["trace", "stats", str(azure_csv), "-f", "azure", "--json"]).stdout
    )
    assert data["num_requests"] == 3


@pytest.mark.parametrize(
    "content, expected",
    [
        (
            '{"arrival": 0, "input_len": 5, "output_len": 1}\n{"arrival": 1, "input_len": -5, "output_len": 1}\n',
            "line 2, field 'input_len': is -5",
        ),
        (
            '{"arrival": 0, "input_len": 5, "output_len": 1}\nnot json\n',
            "line 2: is not valid JSON",
        ),
        ('{"arrival": 0, "input_len": 5}\n', "line 1, field 'output_len': is missing"),
    ],
)
def test_bad_trace_is_one_line_on_stderr_and_exit_2(tmp_path, content, expected):
    trace = tmp_path / "bad.jsonl"
    trace.write_text(content)
    result = runner.invoke(app, ["trace", "stats", str(trace)])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert expected in result.stderr and str(trace) in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_unknown_format_and_self_overwrite_are_refused(tmp_path, azure_csv):
    result = runner.invoke(
        app, ["trace", "convert", str(azure_csv), "-f", "excel", "-o", str(tmp_path / "o")]
    )
    assert result.exit_code == 2 and "unknown trace format 'excel'" in result.stderr
    result = _convert_azure(azure_csv, azure_csv)
    assert result.exit_code == 2 and "is the source file itself" in result.stderr
    assert azure_csv.read_text() == AZURE


def test_every_request_over_the_context_is_an_error_not_an_empty_file(tmp_path, azure_csv):
    out = tmp_path / "o.jsonl"
    result = _convert_azure(azure_csv, out, "--context-len", "10")
    assert result.exit_code == 2 and "all 3 requests" in result.stderr
    assert not out.exists()


def test_shipped_example_reads_and_matches_the_azure_trace_it_was_cut_from(tmp_path):
    example = read_trace(EXAMPLE)
    assert isinstance(example, RequestTrace) and len(example) == 1000
    if AZURE_REAL.exists():
        out = tmp_path / "again.jsonl"
        args = [
            "trace",
            "convert",
            str(AZURE_REAL),
            "-f",
            "azure",
            "--limit",
            "1000",
            "-o",
            str(out),
        ]
        assert runner.invoke(app, args).exit_code == 0
        assert out.read_text() == EXAMPLE.read_text()


def test_one_request_is_counted_in_the_singular(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"arrival": 0, "input_len": 100, "output_len": 10}) + "\n")
    stats = runner.invoke(app, ["trace", "stats", str(trace)])
    assert stats.exit_code == 0, stats.output
    assert "1 request over" in stats.stdout and "1 requests" not in stats.stdout
    converted = runner.invoke(app, ["trace", "convert", str(trace), "-f", "cgtool", "-o", str(tmp_path / "o.jsonl")])
    assert "1 requests" not in converted.output
    plan = runner.invoke(app, ["plan", "--trace", str(trace), "--model", "tiny"])
    assert plan.exit_code == 0, plan.output
    assert "simulating 1 request\n" in plan.stderr and "1 requests" not in plan.output
    assert "(1 sizes)" not in plan.output and re.search(r"\(\d+ sizes?\)", plan.output)
    assert counted(1, "size") == "1 size" and counted(2_048, "request") == "2,048 requests"
