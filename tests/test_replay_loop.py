"""The real loop on the CPU (tiny preset, torch attention, eager): its decisions are the
policy's at the times it asked, so CI checks the loop against the simulator's policy."""

from pathlib import Path

import numpy as np
import pytest

from cgtool.replay.loop import Graphs, Slots
from cgtool.replay.policy import Scheduler
from cgtool.replay.run import prepare
from cgtool.replay.session import build_bench, replay_once
from cgtool.specs.gpus import gpu_spec

LINES = [
    (0.0, 40, 5, 0), (0.001, 100, 8, 0), (0.002, 30, 1, 0), (0.003, 90, 0, 0), (0.03, 200, 6, 50),
    (0.04, 20, 12, 0), (0.041, 150, 3, 0), (0.2, 60, 4, 0), (0.201, 25, 9, 10),
]


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("replay") / "t.jsonl"
    path.write_text("".join(
        f'{{"arrival": {a}, "input_len": {p}, "output_len": {o}, "cached_len": {c}}}\n' for a, p, o, c in LINES))
    return path


def _inputs(trace, **kw):
    settings = {"chunked_prefill_size": 128, "max_running_requests": 3, "max_total_tokens": 500} | kw
    return prepare(trace, default=True, model="tiny", gpu=gpu_spec("H100-80GB"), device="cpu", **settings)


@pytest.fixture(scope="module")
def replayed(trace):
    inputs = _inputs(trace)
    return inputs, replay_once(inputs, build_bench(inputs), Graphs(), lambda _: None)


def test_cpu_replay_makes_the_policys_batch_at_every_step_it_ran(replayed):
    inputs, result = replayed
    # The same policy, asked at the times the loop asked, must choose the same steps.
    again = Scheduler(inputs.reqs, 3, 128, result.settings.kv_tokens)
    for kind, size, start in zip(result.steps.kind, result.steps.size, result.steps.start_ms):
        step = again.next_step(start)
        assert step is not None and (step.kind, step.size) == (kind, size)
    assert again.done


def test_cpu_replay_chunks_prefill_and_bounds_running_requests(replayed):
    _, result = replayed
    sizes = np.array(result.steps.size)
    kinds = np.array(result.steps.kind)
    assert sizes[kinds == "extend"].max() <= 128
    assert sizes[kinds == "decode"].max() <= 3
    assert 128 in sizes[kinds == "extend"]  # the 200-token prompt (150 new) was split


def test_every_request_finishes_after_its_first_token_with_its_trace_output(replayed):
    _, result = replayed
    r = result.requests
    assert result.status == "complete" and result.settings.dropped_requests == 0
    for arrival, first, finish in zip(r.arrival_ms, r.first_token_ms, r.finish_ms):
        assert first is not None and finish is not None and arrival <= first <= finish
    decode_tokens = sum(max(o - 1, 0) for o in r.output_len)
    assert sum(s for k, s in zip(result.steps.kind, result.steps.size) if k == "decode") == decode_tokens


def test_a_small_pool_holds_admission_back_and_is_never_exceeded(trace):
    inputs = _inputs(trace, max_total_tokens=220, max_running_requests=8)
    result = replay_once(inputs, build_bench(inputs), Graphs(), lambda _: None)
    assert result.status == "complete"
    assert result.settings.dropped_requests == 0  # the longest footprint is 206 tokens
    assert max(s for k, s in zip(result.steps.kind, result.steps.size) if k == "decode") < 8


def test_a_stop_keeps_what_ran_and_marks_it_incomplete(trace):
    inputs = _inputs(trace)
    calls = iter(range(1000))
    result = replay_once(inputs, build_bench(inputs), Graphs(), lambda _: None, lambda: next(calls) >= 4)
    assert result.status == "incomplete" and len(result.steps) == 4
    assert any(f is None for f in result.requests.finish_ms)


def test_predictions_come_from_the_simulator_and_agree_with_the_step_policy(replayed):
    _, result = replayed
    [prediction] = result.predictions
    assert prediction.source == "roofline" and prediction.policy_agrees
    assert {m.name for m in result.metrics} >= {"TTFT p50", "TPOT p99", "throughput", "decode batch TVD"}


def test_slots_come_back_whole_after_requests_finish():
    slots = Slots(num_slots=20, num_rows=4)
    row_a, a = slots.take(7)
    row_b, b = slots.take(12)
    assert 0 not in a and 0 not in b and not set(a) & set(b) and row_a != row_b
    slots.give(row_a, a)
    slots.give(row_b, b)
    _, c = slots.take(19)
    assert sorted(c) == list(range(1, 20))
