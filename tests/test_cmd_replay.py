"""`cgtool replay` from the command line: bad input in one line, a CPU run's files, a signal."""

import json
import os
import signal
import subprocess
import sys

import pytest
from cli_run import cgtool

from cgtool.replay.result import load_replay

CPU = ["--model", "tiny", "--gpu", "H100-80GB", "--device", "cpu", "--chunked-prefill-size", "128",
       "--max-running-requests", "4", "--default"]


def _trace(path, n=6, gap_s=0.002):
    path.write_text("".join(f'{{"arrival": {gap_s * i}, "input_len": {20 + 9 * i}, "output_len": {2 + i % 3}}}\n'
                            for i in range(n)))
    return path


def _one_error_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


@pytest.mark.parametrize(("args", "words"), [
    (["--requests", "0"], "--requests 0"),
    (["--load", "0"], "--load 0"),
    (["--device", "tpu"], "--device 'tpu'"),
    (["--max-total-tokens", "1"], "--max-total-tokens 1"),
])
def test_bad_flags_are_one_line_and_exit_2(tmp_path, args, words):
    result = cgtool("replay", "--trace", _trace(tmp_path / "t.jsonl"), *CPU, *args, "--out", tmp_path / "o")
    assert result.exit_code == 2
    assert words in _one_error_line(result)


def test_a_missing_trace_or_schedule_is_one_line_and_exit_2(tmp_path):
    missing = cgtool("replay", "--trace", tmp_path / "nope.jsonl", *CPU)
    assert missing.exit_code == 2 and "nope.jsonl: no such file" in _one_error_line(missing)
    no_schedule = cgtool("replay", "--trace", _trace(tmp_path / "t.jsonl"), "--device", "cpu", "--model", "tiny",
                         "--gpu", "H100-80GB")
    assert no_schedule.exit_code == 2 and "--default" in _one_error_line(no_schedule)


def test_a_batch_trace_is_refused_in_one_line(tmp_path):
    batches = tmp_path / "b.jsonl"
    batches.write_text('{"mode": "decode", "batch_size": 4}\n')
    result = cgtool("replay", "--trace", batches, *CPU)
    assert result.exit_code == 2 and "holds batches" in _one_error_line(result)


def test_a_cpu_replay_writes_replay_json_and_html_and_prints_the_comparison(tmp_path):
    out = tmp_path / "o"
    result = cgtool("replay", "--trace", _trace(tmp_path / "t.jsonl"), *CPU, "--out", out)
    assert result.exit_code == 0, result.output
    assert "TTFT p50" in result.output and "decode batch TVD" in result.output
    replay = load_replay(out / "replay.json")
    assert replay.status == "complete" and replay.settings.requests == 6
    assert (out / "replay.html").is_file() and (out / "figures" / "replay_decode_batch.png").is_file()
    # No plan: the engine default's release, SGLang 0.5.23, records breakable prefill graphs.
    assert replay.settings.prefill_backend == "breakable"


def test_replay_records_the_prefill_backend_it_was_asked_for(tmp_path):
    out = tmp_path / "o"
    result = cgtool("replay", "--trace", _trace(tmp_path / "t.jsonl", n=2), *CPU, "--prefill-backend", "piecewise",
                    "--out", out)
    assert result.exit_code == 0, result.output
    assert load_replay(out / "replay.json").settings.prefill_backend == "piecewise"


def test_plan_reads_a_replay_json_as_its_profile(tmp_path):
    out = tmp_path / "o"
    assert cgtool("replay", "--trace", _trace(tmp_path / "t.jsonl"), *CPU, "--out", out).exit_code == 0
    planned = cgtool("plan", "--trace", _trace(tmp_path / "t.jsonl", n=40, gap_s=0.5), "--model", "tiny",
                     "--gpu", "H100-80GB", "--profile", out / "replay.json", "--out", tmp_path / "p", "--json")
    assert planned.exit_code == 0, planned.output
    plan = json.loads((tmp_path / "p" / "plan.json").read_text())
    assert plan["inputs"]["profile"].endswith("replay.json")


def test_sigint_keeps_an_incomplete_replay_json(tmp_path):
    out = tmp_path / "o"
    trace = _trace(tmp_path / "t.jsonl", n=40, gap_s=1.0)  # 39 s of arrivals: still running when signalled
    args = [sys.executable, "-m", "cgtool.commands.entry", "replay", "--trace", str(trace), *CPU, "--out", str(out)]
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=os.environ | {"COLUMNS": "200"})
    for line in proc.stderr:
        if "replay 40 requests" in line:
            break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    replay = load_replay(out / "replay.json")
    assert replay.status == "incomplete" and replay.settings.requests == 40
    assert any(f is None for f in replay.requests.finish_ms)
