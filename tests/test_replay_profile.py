"""Several capture reports as one profile (`--profile` repeated): captures of one model on one GPU
at different --context-len, merged so that decode attention is priced across their contexts.
The reports are the H200 captures of 2026-11-26 (benchmarks/results/h200-2026-11-26-decode-chunks/
contexts), read here, never copied."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_run import cgtool

from cgtool.errors import InputError
from cgtool.replay.profile import load_profiles

ROOT = Path(__file__).resolve().parents[1]
CONTEXTS = ROOT / "benchmarks/results/h200-2026-11-26-decode-chunks/contexts"
REPORTS = [CONTEXTS / f"ctx-{n}" / "report.json" for n in (1024, 4096, 16384)]
EXAMPLE = ROOT / "examples" / "azure-conv-first-1000.jsonl"


def test_one_file_is_that_file_and_several_add_the_others_decode_rows_at_their_context():
    assert load_profiles(REPORTS[:1]) == load_profiles([REPORTS[0]])
    merged = load_profiles(REPORTS)
    contexts = {(r["kind"], r.get("context_len")) for r in merged["sizes"]}
    assert ("decode", 4096) in contexts and ("decode", 16384) in contexts
    assert all(r.get("context_len") in (None, 1024) for r in merged["sizes"] if r["kind"] == "piecewise")
    decode_16k = [r for r in json.loads(REPORTS[2].read_text())["sizes"] if r["kind"] == "decode"]
    assert sum(r.get("context_len") == 16384 for r in merged["sizes"]) == len(decode_16k)


def test_reports_of_another_model_are_refused(tmp_path):
    other = json.loads(REPORTS[1].read_text())
    other["model"]["name"] = "qwen3-30b-a3b"
    path = tmp_path / "other.json"
    path.write_text(json.dumps(other))
    with pytest.raises(InputError, match="another model or GPU"):
        load_profiles([REPORTS[0], path])


def test_plan_takes_the_profile_repeated_and_names_every_file(tmp_path):
    one = cgtool("plan", "--trace", EXAMPLE, "--gpu", "H200", "--profile", REPORTS[0], "--json")
    three = cgtool("plan", "--trace", EXAMPLE, "--gpu", "H200", *[a for r in REPORTS for a in ("--profile", r)],
                   "--json")
    assert one.exit_code == 0 and three.exit_code == 0, three.output
    a, b = json.loads(one.stdout), json.loads(three.stdout)
    assert all(str(r) in b["inputs"]["profile"] for r in REPORTS)
    # Decode attention priced across 1k-16k contexts, not at 1k alone: the prediction moves.
    assert a["decode"] != b["decode"] or a["simulation"] != b["simulation"]


def test_a_verify_document_cannot_be_merged(tmp_path):
    verify = ROOT / "benchmarks/results/h100-2026-11-26-memory-proof"
    path = next(verify.glob("*/verify.json"))
    result = cgtool("plan", "--trace", EXAMPLE, "--profile", REPORTS[0], "--profile", path)
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0 and "only capture reports can be merged" in result.output


def test_replay_reads_the_profile_repeated_and_names_a_missing_file():
    from cgtool.replay.run import _profile

    merged, name = _profile(REPORTS)
    assert merged == load_profiles(REPORTS) and name == ", ".join(str(r) for r in REPORTS)
    with pytest.raises(InputError, match="no such file"):
        _profile([REPORTS[0], REPORTS[0].with_name("absent.json")])
