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


@pytest.mark.gpu
def test_counting_kernels_finds_each_sizes_kernels_without_importing_inductor():
    """torch.profiler's wrapper imports torch._inductor (and dynamo, sympy) at its first start:
    seconds of a decode-only session. Run in a fresh process, where nothing imported it yet."""
    import subprocess
    import sys

    script = (
        "import sys, torch\n"
        "from cgtool.capture.timing import kernels_per_call, profile_kernels_by_size\n"
        "x = torch.ones(4096, device='cuda')\n"
        "calls = [(1, lambda: x.add_(1)), (2, lambda: (x.add_(1), x.mul_(2)))]\n"
        "counts = {size: kernels_per_call(stats) for size, stats in profile_kernels_by_size(calls).items()}\n"
        "print(counts[1], counts[2], 'torch._inductor' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.split()[-3:] == ["1", "2", "False"]


def test_kernels_go_to_the_range_they_start_in_and_the_ranges_own_gpu_annotation_is_no_kernel():
    """Kineto lists each `cgtool_size_N` range twice: on the host, and on the GPU's timeline
    as a user annotation spanning the range's kernels. Only kernels count (not memcpys)."""
    from types import SimpleNamespace

    import torch

    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA

    def event(name, device, start, end):
        return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(start=start, end=end))

    events = [
        event("cgtool_size_1", cpu, 0, 100), event("cgtool_size_1", cuda, 10, 90),
        event("gemv", cuda, 10, 60), event("norm", cuda, 60, 90), event("Memcpy DtoD", cuda, 5, 10),
        event("cgtool_size_8", cpu, 200, 300), event("cgtool_size_8", cuda, 210, 290),
        event("gemv", cuda, 210, 250), event("gemv", cuda, 250, 290),
    ]
    tables = timing._kernels_in_ranges(events, [1, 8])
    assert {size: timing.kernels_per_call(stats) for size, stats in tables.items()} == {1: 2, 8: 2}
    assert [(k.name, k.launches) for k in tables[8]] == [("gemv", 2)]
    assert tables[1][0].name == "gemv" and tables[1][0].cuda_ms == pytest.approx(0.05)
