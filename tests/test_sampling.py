"""Pooled spread: intervals from every size's samples, and how many samples a size needs."""

from __future__ import annotations

import math

import pytest

from cgtool.capture.sampling import (
    LEARN_EVERY,
    SEED_DOF,
    PathTiming,
    SpreadPool,
    SpreadPools,
    regime_of,
)
from cgtool.capture.timing import t95


def test_the_spread_is_pooled_relative_to_each_sizes_own_mean():
    pool = SpreadPool()
    pool.add([10.0, 12.0])
    pool.add([100.0, 120.0])  # the same relative spread at ten times the time
    deviation = 1 / 11  # each sample from its mean of 11 (or 110)
    assert pool.dof == 2
    assert pool.rel_sd == pytest.approx(math.sqrt(4 * deviation**2 / 2))
    assert pool.ci95_ms(110.0, 2) == pytest.approx(t95(2) * pool.rel_sd * 110.0 / math.sqrt(2))


def test_a_lone_sample_adds_no_spread_and_no_interval_exists_before_any():
    pool = SpreadPool()
    pool.add([25.0])
    assert pool.dof == 0 and pool.rel_sd is None and pool.ci95_ms(25.0, 1) is None


def _pool(rel_sd: float, dof: int) -> SpreadPool:
    return SpreadPool(sum_sq=rel_sd**2 * dof, dof=dof, sizes=dof)  # each size timed twice


def test_an_empty_pool_asks_for_two_samples_in_either_regime():
    assert SpreadPool().samples_for("short", 6.0, 0.03, 30.0, 15) == 2
    assert SpreadPool().samples_for("long", 100.0, 0.03, 30.0, 15) == 2


def test_a_long_call_is_timed_once_only_when_its_pool_is_seeded():
    assert _pool(0.02, SEED_DOF - 1).samples_for("long", 100.0, 0.03, 30.0, 15) == 2
    seeded = _pool(0.02, SEED_DOF)
    seeded.sizes = 40  # however many long sizes were timed once since
    assert seeded.samples_for("long", 100.0, 0.03, 30.0, 15) == 1


def test_short_sizes_are_timed_twice_one_in_learn_every_once_seeded():
    """Host noise moves through a run, so the short pool keeps learning: once seeded, one
    size in LEARN_EVERY gets a second call, however quiet the pool is."""
    pool = SpreadPool()
    counts = []
    for _ in range(22):
        n = pool.samples_for("short", 6.0, 0.03, 30.0, 15)
        pool.add([6.0, 6.001][:n])
        counts.append(n)
    assert LEARN_EVERY == 6  # the expected counts below are for one size in six
    assert counts == [2, 2, 2] + [1] * 15 + [2, 1, 1, 1]
    assert LEARN_EVERY * pool.dof >= pool.sizes


def test_the_spread_sets_the_samples_when_the_budget_can_buy_them():
    # 3% spread at 20 dof: t 2.09, so (2.09 x 3% / 3%)^2 = 4.4 -> 5 samples of a 5 ms replay.
    assert _pool(0.03, 20).samples_for("short", 5.0, 0.03, 30.0, 15) == 5
    # The same five on 10 ms calls would take 50 ms of a 30 ms budget: the least, one.
    assert _pool(0.03, 20).samples_for("short", 10.0, 0.03, 30.0, 15) == 1
    # A host-bound eager path (15% spread) would need a hundred: one call, or the two the
    # pool's learning asks for when it holds fewer than one degree of freedom in LEARN_EVERY
    # sizes.
    assert _pool(0.15, 60).samples_for("short", 20.0, 0.03, 30.0, 15) == 1
    behind = _pool(0.15, 60)
    behind.sizes = LEARN_EVERY * 60
    assert behind.samples_for("short", 20.0, 0.03, 30.0, 15) == 2
    # Past the cap of calls a size the target is out of reach as well, however cheap they are.
    assert _pool(0.15, 60).samples_for("short", 0.5, 0.03, 30.0, 15) == 1
    assert _pool(0.02, 60).samples_for("short", 0.5, 0.03, 30.0, 15) == 2  # (2.0 x 2% / 3%)^2 = 1.8


def test_an_interval_follows_its_pool_as_later_sizes_sharpen_it():
    pools = SpreadPools()
    pool = pools.pool("replay", "short")
    timing = PathTiming((6.0, 6.6), "short", pool)
    pool.add(timing.samples)
    early = timing.ci95_ms
    for _ in range(20):  # twenty quieter sizes
        pool.add([8.0, 8.08])
    assert pools.pool("replay", "short") is pool
    assert timing.ci95_ms < early / 5  # t falls from 12.7 and the pooled spread with it


def test_a_size_is_long_when_both_first_calls_are():
    assert regime_of(30.0, 24.9) == "short" and regime_of(25.0, 25.0) == "long"
    assert regime_of(18.6, 32.2) == "short"  # a 7 ms replay the host paused
