"""Batch timing and the replay check's call budget, with the CUDA events stood in for (CPU)."""

from __future__ import annotations

import torch

from cgtool.capture import measure, timing


def _fake_batches(monkeypatch, ms_per_call: float) -> list[int]:
    """Every timed batch takes `ms_per_call` per call; returns the batch sizes timed."""
    batches: list[int] = []

    def one_batch(fn, calls):
        for _ in range(calls):
            fn()
        batches.append(calls)
        return ms_per_call * calls

    monkeypatch.setattr(timing, "_one_batch_ms", one_batch)
    return batches


def test_a_call_already_timed_replaces_the_sizing_call(monkeypatch):
    batches = _fake_batches(monkeypatch, 20.0)
    calls = []
    result = timing.time_cuda(lambda: calls.append(1), first_ms=20.0)
    # A 20 ms call makes one-call batches, and the given call is the first sample; two
    # equal samples already pin the mean.
    assert batches == [1] and len(calls) == 1
    assert result.batches == 2 and result.mean_ms == 20.0 and result.ci95_ms == 0.0


def test_two_samples_end_it_only_within_half_a_percent(monkeypatch):
    """At one degree of freedom the 95% interval is 6.4 times the samples' gap: 0.4% apart
    is within 3% of the mean, 1% apart is not, and a third sample is timed."""
    for gap, expected in ((0.004, 2), (0.01, 3)):
        samples = iter([20.0 * (1 + gap), 20.0, 20.0 * (1 + gap / 2)])
        monkeypatch.setattr(timing, "_one_batch_ms", lambda fn, calls, s=samples: next(s))
        result = timing.time_cuda(lambda: None, first_ms=20.0)
        assert result.batches == expected


def test_without_a_timed_call_the_first_batch_sizes_the_rest(monkeypatch):
    batches = _fake_batches(monkeypatch, 0.5)
    result = timing.time_cuda(lambda: None)
    assert batches[0] == 1 and set(batches[1:]) == {10}  # 5 ms batches of 0.5 ms calls
    assert result.calls_per_batch == 10 and result.batches == len(batches) - 1


def test_the_replay_check_compares_the_first_timed_call_of_each_path(monkeypatch):
    _fake_batches(monkeypatch, 30.0)
    timed: list[str] = []
    compared = {"eager": [torch.ones(2, 3)], "replay": [torch.ones(2, 3)]}

    def timed_call(fn):
        out = fn()
        timed.append(next(name for name, value in compared.items() if value is out))
        return out, 30.0

    monkeypatch.setattr(measure, "timed_call", timed_call)
    eager_calls, replay_calls = [], []
    check = measure.check_replay(
        eager=lambda: compared["eager"], replay=lambda: compared["replay"], dtype=torch.bfloat16,
        timed_eager=lambda: eager_calls.append(1), timed_replay=lambda: replay_calls.append(1),
    )
    assert timed == ["eager", "replay"]  # each compared once, eager first
    assert check.safe and check.max_abs_diff == 0.0
    # 30 ms calls: the compared call plus one equal one-call batch make two samples per path.
    assert len(eager_calls) == len(replay_calls) == 1
    assert check.eager.batches == check.replay.batches == 2


def test_short_replays_are_timed_back_to_back_in_pairs(monkeypatch):
    """A 7 ms replay is timed two to a batch, so the host issues the second while the GPU
    runs the first; the lone verified call, launch gap included, is not a sample."""
    batches = _fake_batches(monkeypatch, 7.0)
    result = timing.time_cuda(lambda: None, first_ms=7.3, back_to_back_below_ms=25.0)
    assert batches == [2, 2] and result.calls_per_batch == 2
    assert result.mean_ms == 7.0  # the first call's 7.3 ms is not among the samples


def test_calls_past_the_back_to_back_limit_keep_one_call_batches():
    assert timing.calls_per_batch(30.0, batch_ms=5.0, back_to_back_below_ms=25.0) == 1
    assert timing.calls_per_batch(7.0, batch_ms=5.0, back_to_back_below_ms=25.0) == 2
    assert timing.calls_per_batch(0.5, batch_ms=5.0, back_to_back_below_ms=25.0) == 10
    assert timing.calls_per_batch(7.0, batch_ms=5.0) == 1  # eager: the verified call counts


def test_the_replay_check_times_short_replays_back_to_back(monkeypatch):
    batches = _fake_batches(monkeypatch, 5.0)
    monkeypatch.setattr(measure, "timed_call", lambda fn: (fn(), 5.0))
    check = measure.check_replay(
        eager=lambda: [torch.ones(1)], replay=lambda: [torch.ones(1)], dtype=torch.bfloat16,
    )
    assert check.replay.calls_per_batch == 2 and check.eager.calls_per_batch == 1
    assert batches == [1, 2, 2]  # eager's second sample, then two pairs of replays


def test_no_batch_starts_that_would_end_past_the_budget(monkeypatch):
    """Samples that never agree: a 28 ms call stops at two samples (a third would end at 56 ms,
    past the 30 ms budget); a 14 ms call gets a third (it ends at 28 ms) but not a fourth."""
    for ms, expected in ((28.0, 2), (14.0, 3)):
        clock = [0.0]
        spread = iter([1.2, 0.8, 1.1, 0.9, 1.3])

        def one_batch(fn, calls, ms=ms, spread=spread):
            clock[0] += ms / 1e3 * calls
            return ms * calls * next(spread)

        monkeypatch.setattr(timing, "_one_batch_ms", one_batch)
        monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])
        result = timing.time_cuda(lambda: None, first_ms=ms, budget_s=0.03)
        assert result.batches == expected
