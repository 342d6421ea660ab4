"""verify's largest safe fraction (cgtool.verify.proof), against the rehearsals measured on an
H100 80GB HBM3 on 2026-11-26 (benchmarks/results/h100-2026-11-26-memory/*/verify.json: each
file holds the rehearsal at the plan's fraction and the proof run at the tightened one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cgtool.verify.proof import (
    DEFAULT_HEADROOM_BYTES,
    recommended_fraction,
    tightened_fraction,
)
from cgtool.verify.result import Rehearsal, load_verify

GIB = 1 << 30
RESULTS = Path(__file__).resolve().parents[1] / "benchmarks/results/h100-2026-11-26-memory"
RUNS = sorted(p.parent for p in RESULTS.glob("*/verify.json"))


def test_six_runs_were_measured():
    assert {p.name.split("-azure")[0].split("-mooncake")[0] for p in RUNS} == {
        "llama-3.1-8b", "qwen3-30b-a3b", "deepseek-v2-lite"}
    assert len(RUNS) == 6


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_the_fraction_tightened_from_the_first_rehearsal_was_proven_with_the_headroom_asked(run):
    result = load_verify(run / "verify.json")
    proof = result.proof
    assert proof is not None
    expected = tightened_fraction(result.settings.mem_fraction_static, result.rehearsal, DEFAULT_HEADROOM_BYTES)
    assert proof.mem_fraction_static == expected
    # The band: the proven fraction's rehearsal leaves 1.5-3.5 GiB at the worst step.
    assert proof.rehearsal.status == "ok"
    assert 1.5 * GIB <= proof.rehearsal.headroom_bytes <= 3.5 * GIB
    assert result.recommended_mem_fraction_static == proof.mem_fraction_static


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_the_proof_build_gets_a_smaller_pool_than_a_fresh_server_would(run):
    # The first build's process keeps what its captures loaded (kernel modules, workspaces)
    # resident, so the proof's pool at the same fraction comes out smaller than the first
    # build's would have, and its rehearsal pays nothing for them again: the headroom is
    # what carries over, and the KV tokens a server gets come from the first build.
    from cgtool.specs.config import load_model_config
    from cgtool.verify.proof import kv_tokens_at

    result = load_verify(run / "verify.json")
    assert result.proof is not None
    token_bytes = load_model_config(result.model.name).kv_bytes_per_token(2)
    fresh = kv_tokens_at(result.settings.kv_tokens, result.settings.mem_fraction_static,
                         result.proof.mem_fraction_static, result.rehearsal.total_bytes, token_bytes)
    assert result.proof.kv_tokens < fresh


def _rehearsal(status: str, headroom_gib: float, remedy: str | None = None) -> Rehearsal:
    return Rehearsal(status, 8192, 1024, 1000, 0, int(headroom_gib * GIB), 80 * GIB, remedy=remedy)


def test_more_headroom_than_asked_raises_the_fraction_and_less_lowers_it():
    assert tightened_fraction(0.88, _rehearsal("ok", 5.5), DEFAULT_HEADROOM_BYTES) == 0.93
    assert tightened_fraction(0.88, _rehearsal("ok", 0.7), DEFAULT_HEADROOM_BYTES) == 0.87


def test_after_an_out_of_memory_the_guess_starts_below_the_remedy():
    failed = _rehearsal("oom", 0.1, "Lower --mem-fraction-static to 0.85 or below (the plan says 0.890).")
    assert tightened_fraction(0.89, failed, DEFAULT_HEADROOM_BYTES) == 0.831
    assert tightened_fraction(0.89, _rehearsal("oom", 0.1, None), DEFAULT_HEADROOM_BYTES) is None
    assert tightened_fraction(0.89, _rehearsal("skipped", 0), DEFAULT_HEADROOM_BYTES) is None


def test_a_failed_fraction_is_never_recommended():
    tried = [(0.93, _rehearsal("oom", 0.0)), (0.90, _rehearsal("ok", 2.0))]
    assert recommended_fraction(tried, DEFAULT_HEADROOM_BYTES) == (0.90, None)
    fraction, note = recommended_fraction([(0.93, _rehearsal("oom", 0.0))], DEFAULT_HEADROOM_BYTES)
    assert fraction is None and "none is recommended" in note


def test_the_highest_fraction_with_the_headroom_wins_else_the_roomiest_pass_with_a_note():
    tried = [(0.90, _rehearsal("ok", 4.0)), (0.92, _rehearsal("ok", 2.0))]
    assert recommended_fraction(tried, DEFAULT_HEADROOM_BYTES) == (0.92, None)
    tight = [(0.90, _rehearsal("ok", 1.2)), (0.92, _rehearsal("ok", 0.5))]
    fraction, note = recommended_fraction(tight, DEFAULT_HEADROOM_BYTES)
    assert fraction == 0.90 and "less than the 1.50 GiB asked" in note
