"""The replay check's calls: which are compared, which are timed, which are samples (CPU,
with CUDA events stood in for by a clock that charges a launch gap to a call the GPU was
idle for); and, on the GPU, that calls queued behind a busy GPU hold no launch gap."""

from __future__ import annotations

from types import SimpleNamespace
from typing import ClassVar

import pytest
import torch

from cgtool.capture import measure
from cgtool.capture.sampling import SEED_DOF, SpreadPools

GAP_MS = 0.4  # a lone call's launch gap


class FakeTimer:
    """CallTimer's contract: a call's time is `ms_of[name]` of the path it ran, plus the gap
    when the GPU was idle before it (the first call of a timer not queued behind a spin)."""

    ms_of: ClassVar[dict[str, float]] = {}
    log: ClassVar[list[str]] = []
    held = False  # hold_gpu was called and no timer has started behind it yet

    def __init__(self) -> None:
        self.times: list[float] = []
        self.drained = not FakeTimer.held
        FakeTimer.held = False

    def call(self, fn):
        result = fn()
        self.times.append(self.ms_of[self.log[-1]] + (GAP_MS if self.drained else 0.0))
        self.drained = False
        return result

    def ms(self, index: int) -> float:
        return self.times[index]

    def all_ms(self) -> list[float]:
        return list(self.times)


@pytest.fixture
def paths(monkeypatch):
    """Eager and replay callables that log their calls; `set(eager=, replay=)` their times."""
    log: list[str] = []
    FakeTimer.log, FakeTimer.held = log, False
    monkeypatch.setattr(measure, "CallTimer", FakeTimer)
    monkeypatch.setattr(measure, "hold_gpu", lambda: setattr(FakeTimer, "held", True))
    monkeypatch.setattr(measure, "timed_call", lambda fn: (fn(), FakeTimer.ms_of[log[-1]] + GAP_MS))

    def path(name):
        def run():
            log.append(name)
            return [torch.full((2, 3), 1.0)]
        return run

    def set_ms(eager: float, replay: float) -> None:
        FakeTimer.ms_of = {"eager": eager, "replay": replay}

    return SimpleNamespace(eager=path("eager"), replay=path("replay"), log=log, set=set_ms)


def _check(paths, pools):
    return measure.check_replay(paths.eager, paths.replay, torch.bfloat16, pools=pools)


def test_replays_are_timed_behind_a_spin_and_the_compared_calls_are_samples(paths):
    paths.set(eager=20.0, replay=6.0)
    check = _check(paths, SpreadPools())
    assert paths.log == ["eager", "replay", "replay", "eager"]  # each path compared, then timed
    assert check.replay.samples == (6.0, 6.0)  # no launch gap, the compared replay's included
    # Each eager sample starts on an idle GPU, as a lone eager step does.
    assert check.eager.samples == (20.0 + GAP_MS, 20.0 + GAP_MS)
    assert check.safe and check.replay.regime == "short"


def test_long_calls_are_timed_twice_until_the_pool_is_seeded_then_once(paths):
    paths.set(eager=100.0, replay=98.0)
    pools = SpreadPools()
    counts = []
    for _ in range(SEED_DOF + 2):
        paths.log.clear()
        check = _check(paths, pools)
        counts.append((paths.log.count("eager"), paths.log.count("replay")))
        assert check.replay.regime == "long"
    assert counts == [(2, 2)] * SEED_DOF + [(1, 1)] * 2
    assert check.replay.samples == (98.0,)  # the compared call is the sample
    assert check.replay.ci95_ms is not None  # from the seeded pool


def test_the_compared_outputs_are_the_first_calls(paths):
    paths.set(eager=20.0, replay=6.0)
    calls = {"replay": 0}

    def replay():
        paths.replay()
        calls["replay"] += 1
        return [torch.full((2, 3), 1.0 if calls["replay"] == 1 else 9.0)]  # later calls drift

    check = measure.check_replay(paths.eager, replay, torch.bfloat16, pools=SpreadPools())
    assert check.max_abs_diff == 0.0 and calls["replay"] == 2


def test_a_replay_that_differs_is_named_by_output_and_row(paths):
    paths.set(eager=20.0, replay=6.0)

    def eager():
        paths.eager()
        return [torch.ones(4, 3)]

    def replay():
        paths.replay()
        out = torch.ones(4, 3)
        out[2, 1] = 3.0
        return [out]

    check = measure.check_replay(eager, replay, torch.bfloat16, pools=SpreadPools())
    assert not check.safe and (check.max_abs_diff, check.worst_token) == (2.0, 2)


def test_with_tp_every_rank_issues_the_most_calls_any_rank_asked_for(paths, monkeypatch):
    """Ranks that issued different numbers of forwards would pair their collectives wrongly:
    each count is the largest over the ranks."""
    paths.set(eager=20.0, replay=6.0)
    monkeypatch.setattr(measure, "all_ranks", lambda counts: [counts, [counts[0] + 2, counts[1] + 1]])
    check = _check(paths, SpreadPools())
    # Alone this rank would time each path twice; the other asked for 2 and 1 calls more.
    assert paths.log.count("replay") == 4 and paths.log.count("eager") == 3
    assert len(check.replay.samples) == 4 and len(check.eager.samples) == 3


@pytest.mark.gpu
def test_calls_queued_behind_a_busy_gpu_are_timed_without_the_hosts_gap():
    """The premise of back-to-back timing, on real events: each call spends 4 ms on the host
    before queueing a GPU spin of about 10 ms. The first call's time holds the host's 4 ms
    (the GPU sat idle); every later one only the spin, since the host queued it early."""
    import time

    from cgtool.capture.timing import CallTimer, hold_gpu, timed_call

    cycles = 20_000_000
    torch.cuda._sleep(cycles)
    spin_ms = min(timed_call(lambda: torch.cuda._sleep(cycles))[1] for _ in range(3))

    def call():
        time.sleep(0.004)
        torch.cuda._sleep(cycles)

    timer = CallTimer()
    for _ in range(4):
        timer.call(call)
    first, *rest = timer.all_ms()
    assert first > spin_ms + 3.0
    assert all(abs(ms - spin_ms) < 0.05 * spin_ms for ms in rest), (spin_ms, rest)

    # Behind hold_gpu's spin the first call is back to back too, where the host's work
    # before its kernel (0.3 ms here, as a decode replay's input copies and launch) fits in
    # the spin. A busy wait: a sleep that short can oversleep by a millisecond.
    def quick():
        until = time.perf_counter() + 0.0003
        while time.perf_counter() < until:
            pass
        torch.cuda._sleep(cycles)

    hold_gpu()
    timer = CallTimer()
    timer.call(quick)
    assert abs(timer.all_ms()[0] - spin_ms) < 0.05 * spin_ms


def test_a_short_size_in_a_seeded_pool_costs_only_its_compared_calls(paths):
    paths.set(eager=20.0, replay=6.0)
    pools = SpreadPools()
    logs = []
    for _ in range(SEED_DOF + 1):
        paths.log.clear()
        check = _check(paths, pools)
        logs.append(list(paths.log))
    assert logs[-1] == ["eager", "replay"]
    assert check.replay.samples == (6.0,) and check.eager.samples == (20.0 + GAP_MS,)
