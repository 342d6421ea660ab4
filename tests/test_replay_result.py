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
