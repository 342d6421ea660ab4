"""`plan --profile verify.json` recommends the fraction verify proved (cgtool.planner.proven),
read from the verify.json files measured on an H100 80GB HBM3 on 2026-11-26
(benchmarks/results/h100-2026-11-26-memory)."""

from __future__ import annotations

from pathlib import Path

from cgtool.documents.results import load_plan
from cgtool.planner.proven import apply_proof, model_family
from cgtool.specs.config import load_model_config
from cgtool.specs.gpus import GPU_SPECS
from cgtool.verify.profile import load_profile

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks/results/h100-2026-11-26-memory"
RUN = RESULTS / "qwen3-30b-a3b-azure-conv-first-1000"
H100 = next(g for g in GPU_SPECS.values() if g.name == "H100-80GB")
H200 = next(g for g in GPU_SPECS.values() if g.name == "H200")


def _memory_and_profile():
    plan = load_plan(RUN / "plan.json")
    return plan.memory, load_profile(RUN / "verify.json")


def test_the_proven_fraction_replaces_the_predicted_one_on_the_gpu_it_was_proven_on():
    memory, profile = _memory_and_profile()
    cfg = load_model_config("qwen3-30b-a3b")
    proven, notes = apply_proof(memory, profile, cfg, H100)
    assert memory.mem_fraction_static == 0.885  # the plan's prediction
    assert proven.mem_fraction_static == 0.919 and proven.fraction_source == "proven"
    assert proven.kv_tokens > memory.kv_tokens
    assert len(notes) == 1 and "proven on this GPU" in notes[0]


def test_a_family_never_measured_on_this_gpu_class_gets_a_one_line_unproven_note():
    memory, profile = _memory_and_profile()
    for cfg in (load_model_config("qwen3-30b-a3b"), load_model_config("deepseek-v2-lite")):
        kept, notes = apply_proof(memory, profile if cfg.name != "qwen3-30b-a3b" else None, cfg, H200)
        assert kept.mem_fraction_static == memory.mem_fraction_static
        assert kept.fraction_source == "predicted"
        assert len(notes) == 1 and "\n" not in notes[0]
        assert "not proven" in notes[0] and "cgtool verify --plan plan.json" in notes[0]
        assert model_family(cfg) in notes[0] and "H200" in notes[0]


def test_a_family_measured_on_the_h100_is_predicted_there_without_a_note():
    # The H100 runs of 2026-11-26 measured every term for dense, MoE and MLA models.
    memory, profile = _memory_and_profile()
    kept, notes = apply_proof(memory, profile, load_model_config("llama-3.1-8b"), H100)
    assert kept.fraction_source == "predicted" and notes == []


def test_a_fraction_that_failed_is_never_recommended():
    memory, profile = _memory_and_profile()
    failed = profile | {"memory_proof": profile["memory_proof"] | {
        "recommended_mem_fraction_static": None, "failed_mem_fraction_static": [0.885, 0.919]}}
    kept, notes = apply_proof(memory, failed, load_model_config("qwen3-30b-a3b"), H100)
    assert kept.mem_fraction_static < 0.885
    assert "unproven" in notes[0]


def test_families():
    assert [model_family(load_model_config(m)) for m in ("llama-3.1-8b", "qwen3-30b-a3b", "deepseek-v2-lite")] == [
        "dense", "MoE", "MLA"]


def test_a_verify_whose_steps_all_replayed_teaches_their_times_and_feeds_its_proof():
    # qwen3-30b-a3b's 100-step verify ran every step on a graph, none eagerly. Once `plan
    # --profile` exited 2 on it, then its step times stayed the roofline's: a kind needed both
    # sides. Its replayed steps now teach the graphs' times, the eager side following the
    # roofline's gap, and its proven fraction still reaches the plan.
    from cgtool.planner.profile_fit import profile_cost

    memory, profile = _memory_and_profile()
    decode = [r for r in profile["sizes"] if r["kind"] == "decode"]
    assert decode and all(r["replay_ms"] < r["eager_ms"] for r in decode)
    cost = profile_cost(profile, load_model_config("qwen3-30b-a3b"), H100, max_bs=256, max_tokens=8192,
                        source="verify.json")
    assert cost.source == "verify.json"
    proven, _ = apply_proof(memory, profile, load_model_config("qwen3-30b-a3b"), H100)
    assert proven.fraction_source == "proven"
