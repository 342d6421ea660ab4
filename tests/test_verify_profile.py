from verify_fixture import synthetic_result

from cgtool.specs.config import load_model_config
from cgtool.specs.gpus import gpu_spec
from cgtool.planner.profile_fit import profile_cost
from cgtool.verify.profile import load_profile, verify_as_profile
from cgtool.verify.result import write_verify


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
