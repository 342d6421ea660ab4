"""replay.json round trip, the compared figures, and the profile adapter plan --profile reads."""

import json

import pytest

from cgtool.documents.results import Environment, ModelInfo
from cgtool.errors import InputError
from cgtool.replay.profile import load_profile, replay_as_profile
from cgtool.replay.result import (
    ReplayResult,
    ReplaySettings,
    RequestLog,
    StepLog,
    is_replay_document,
    load_replay,
    write_replay,
)
from cgtool.replay.summary import summarise, total_variation


def _result(gpu_name="NVIDIA H100 80GB HBM3") -> ReplayResult:
    steps = StepLog()
    # Two requests: one extend of both prompts, then two decode steps of both, one of one.
    steps.append("extend", 150, 160, 0.0, 20.0, 0, 150 * 151 / 2)
    steps.append("decode", 2, 2, 20.0, 8.0, 152, 0.0)
    steps.append("decode", 2, 2, 28.0, 8.0, 154, 0.0)
    steps.append("decode", 1, 0, 36.0, 10.0, 78, 0.0)
    requests = RequestLog([0.0, 0.0], [100, 50], [0, 0], [4, 3], [20.0, 20.0], [46.0, 36.0])
    settings = ReplaySettings("t.jsonl", "plan", None, 2, 1.0, 8192, 8, 10_000, 0.8, [2, 4], [160],
                              "triton", "cuda", 0)
    env = Environment(gpu_name, 80 << 30, "", "", "2.11", "0", "host")
    model = ModelInfo("llama-3.1-8b", "LlamaForCausalLM", "abc", "bfloat16", 1, 32)
    return ReplayResult(env, model, settings, requests, steps)


def test_measured_figures_follow_their_definitions():
    s = summarise(_result().requests, _result().steps)
    assert s.ttft_p50_ms == 20.0
    # TPOT: (46 - 20) / 3 and (36 - 20) / 2
    assert s.tpot_mean_ms == pytest.approx((26 / 3 + 8) / 2)
    assert s.throughput_tok_s == pytest.approx(7 / 0.046)
    assert (s.decode_sizes, s.decode_counts) == ([1, 2], [1, 2])
    assert s.decode_step_ms == pytest.approx(26 / 3) and s.graph_share == 0.75


def test_total_variation_is_zero_for_equal_shapes_and_one_for_disjoint():
    assert total_variation([1, 2], [2, 4], [1, 2], [1, 2]) == 0.0
    assert total_variation([1], [5], [3], [5]) == 1.0
    assert total_variation([1, 2], [1, 1], [2], [1]) == pytest.approx(0.5)


def test_replay_json_round_trips_and_is_recognised(tmp_path):
    path = tmp_path / "replay.json"
    result = _result()
    write_replay(result, path)
    assert is_replay_document(path)
    back = load_replay(path)
    assert back.steps.size == result.steps.size and back.requests.finish_ms == [46.0, 36.0]


def test_a_damaged_replay_json_is_one_input_error_naming_the_field(tmp_path):
    path = tmp_path / "replay.json"
    data = _result().to_dict()
    data["steps"]["time_ms"] = "fast"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match="steps.time_ms"):
        load_replay(path)


def test_profile_rows_take_graph_steps_at_their_padded_size_and_eager_at_their_own(tmp_path):
    profile = replay_as_profile(_result())
    rows = {(r["kind"], r["size"]): r for r in profile["sizes"]}
    assert set(rows) == {("decode", 1), ("decode", 2), ("piecewise", 160)}
    # bs 1 ran eagerly (10 ms less its attention), bs 2 on its graph (8 ms less attention).
    assert rows[("decode", 1)]["eager_ms"] < 10.0 and rows[("decode", 2)]["replay_ms"] < 8.0
    for r in rows.values():
        assert 0 < r["replay_ms"] <= r["eager_ms"]
    path = tmp_path / "replay.json"
    write_replay(_result(), path)
    assert load_profile(path)["sizes"] == profile["sizes"]


def test_attention_price_is_fitted_within_steps_of_one_graph_and_reaches_the_cost_model():
    from cgtool.planner.profile_fit import profile_cost
    from cgtool.specs.config import load_model_config
    from cgtool.specs.gpus import gpu_spec

    result = _result()
    steps = StepLog()
    # Decode on graphs 8 and 16: dense 5 and 6 ms, plus 4e-5 ms per context token read.
    for padded, dense in ((8, 5.0), (16, 6.0)):
        for context in range(1000, 40_000, 3000):
            steps.append("decode", padded - 1, padded, 0.0, dense + 4e-5 * context, context, 0.0)
    steps.append("extend", 512, 512, 0.0, 12.0, 0, 512 * 513 / 2)
    result.steps = steps
    profile = replay_as_profile(result)
    assert profile["attention"]["kv_read_ms_per_token"] == pytest.approx(4e-5)
    rows = {(r["kind"], r["size"]): r for r in profile["sizes"]}
    assert rows[("decode", 8)]["replay_ms"] == pytest.approx(5.0)
    assert rows[("decode", 16)]["replay_ms"] == pytest.approx(6.0)
    cost = profile_cost(profile, load_model_config("llama-3.1-8b"), gpu_spec("H100-80GB"), max_bs=32,
                        max_tokens=1024, source="replay.json")
    assert cost.kv_read_ms_per_token == pytest.approx(4e-5)
    assert cost.decode_graph_ms[16] == pytest.approx(6.0)


def test_near_sizes_are_one_point_so_the_tables_tail_slope_is_not_noise():
    result = _result()
    steps = StepLog()
    for _ in range(20):
        steps.append("extend", 4090, 4096, 0.0, 100.0, 0, 0.0)
        steps.append("extend", 2000, 2048, 0.0, 50.0, 0, 0.0)
    steps.append("extend", 4107, 0, 0.0, 110.0, 0, 0.0)  # one eager step just past the graph
    result.steps = steps
    sizes = [r["size"] for r in replay_as_profile(result)["sizes"] if r["kind"] == "piecewise"]
    assert sizes == [2048, 4096]
