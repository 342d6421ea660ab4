"""Batch timing of short calls (a copy, one linear), with the CUDA events stood in for (CPU)."""

from __future__ import annotations

import pytest

from cgtool.capture import timing


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


def test_the_first_call_sizes_the_batches_that_follow(monkeypatch):
    batches = _fake_batches(monkeypatch, 0.5)
    result = timing.time_cuda(lambda: None)
    assert batches[0] == 1 and set(batches[1:]) == {10}  # 5 ms batches of 0.5 ms calls
    assert result.calls_per_batch == 10 and result.batches == len(batches) - 1
    assert result.mean_ms == 0.5 and result.ci95_ms == 0.0


def test_two_samples_end_it_only_within_half_a_percent(monkeypatch):
    """At one degree of freedom the 95% interval is 6.4 times the samples' gap: 0.4% apart
    is within 3% of the mean, 1% apart is not, and a third sample is timed."""
    for gap, expected in ((0.004, 2), (0.01, 3)):
        samples = iter([20.0, 20.0 * (1 + gap), 20.0, 20.0 * (1 + gap / 2)])
        monkeypatch.setattr(timing, "_one_batch_ms", lambda fn, calls, s=samples: next(s))
        result = timing.time_cuda(lambda: None, budget_s=10.0)
        assert result.batches == expected


def test_no_batch_starts_that_would_end_past_the_budget(monkeypatch):
    """Samples that never agree: a 28 ms call stops at two samples (a third would end at 56 ms,
    past the 30 ms budget); a 14 ms call gets a third (it ends at 28 ms) but not a fourth."""
    for ms, expected in ((28.0, 2), (14.0, 3)):
        clock = [0.0]
        spread = iter([1.0, 1.2, 0.8, 1.1, 0.9, 1.3])

        def one_batch(fn, calls, ms=ms, spread=spread, clock=clock):
            clock[0] += ms / 1e3 * calls
            return ms * calls * next(spread)

        monkeypatch.setattr(timing, "_one_batch_ms", one_batch)
        monkeypatch.setattr(timing.time, "perf_counter", lambda clock=clock: clock[0])
        result = timing.time_cuda(lambda: None, budget_s=0.03)
        assert result.batches == expected


def test_holding_the_gpu_spins_it_once_and_a_torch_without_the_spin_is_tolerated(monkeypatch):
    import torch

    spins = []
    monkeypatch.setattr(torch.cuda, "_sleep", spins.append, raising=False)
    timing.hold_gpu()
    assert spins == [timing.HOLD_CYCLES]
    monkeypatch.delattr(torch.cuda, "_sleep")
    timing.hold_gpu()  # nothing to call: no error


def test_plain_torch_host_time_is_a_chain_of_adds_divided_by_its_length(monkeypatch):
    import torch

    chains = []

    def host_ms(fn, repeats=5):
        chains.append(fn())
        return 2.56  # ms for the whole chain

    monkeypatch.setattr(timing, "host_launch_ms", host_ms)
    assert timing.plain_torch_host_us("cpu", ops=256) == 10.0
    assert torch.equal(chains[0], torch.ones(4096, dtype=torch.bfloat16))  # adds of zeros


@pytest.mark.gpu
def test_plain_torch_host_time_on_the_gpu_is_microseconds():
    us = timing.plain_torch_host_us("cuda")
    assert 0.5 < us < 500
