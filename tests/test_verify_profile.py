from dataclasses import replace

from verify_fixture import synthetic_result

from cgtool.specs.config import load_model_config
from cgtool.specs.gpus import gpu_spec
from cgtool.planner.cost import roofline_cost
from cgtool.planner.profile_fit import profile_cost
from cgtool.verify.profile import load_profile, verify_as_profile
from cgtool.verify.result import SizeTiming, write_verify


def test_a_verification_feeds_the_profile_fit(tmp_path):
    result = synthetic_result()
    write_verify(result, tmp_path / "verify.json")
    profile = load_profile(tmp_path / "verify.json")
    assert profile == verify_as_profile(result)
    cost = profile_cost(profile, load_model_config("llama-3.1-8b"), gpu_spec("H100-80GB"), max_bs=256,
                        max_tokens=8192, source="verify.json")
    assert cost.source == "verify.json"
    assert {row["kind"] for row in profile["sizes"]} <= {"decode", "piecewise"}
    assert all(row["replay_ms"] <= row["eager_ms"] for row in profile["sizes"])


def test_a_verified_prefill_step_loses_its_attention_once_in_the_fit():
    cfg, gpu = load_model_config("llama-3.1-8b"), gpu_spec("H100-80GB")
    result = synthetic_result()
    # Hand-made: 512-token prefills over a 100-token cached prefix, 1.5 ms eager, 1.0 ms on
    # the 512-token graph; no decode rows (the roofline fills that kind).
    rows = [SizeTiming("extend", 512, 100, 4, 4.0, 0, 1.5, 0.0),
            SizeTiming("extend", 512, 100, 4, 4.0, 512, 1.0, 0.0)]
    result.sets = [replace(s, sizes=rows if s.name == "plan" else []) for s in result.sets]
    cost = profile_cost(verify_as_profile(result), cfg, gpu, max_bs=8, max_tokens=1024, source="verify.json")
    pair_ms = roofline_cost(cfg, gpu, max_bs=1, max_tokens=1).attention_ms_per_pair
    # Attention of one such step: 512 queries each over the 100 cached keys, plus the causal
    # 512 * 513 / 2 pairs among themselves; the dense part is the rest.
    attention = pair_ms * (512 * 100 + 512 * 513 / 2)
    assert abs(cost.extend_graph_ms[512] - (1.0 - attention)) < 1e-9
    assert abs(cost.extend_eager_ms[512] - (1.5 - attention)) < 1e-9
