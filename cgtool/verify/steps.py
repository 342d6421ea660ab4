"""The steps a verification replays: a stratified, seeded sample of the simulated steps.

A plan's simulation yields, per kind, how many steps ran at each size and the mean context
they carried. Verification cannot replay every step, so it replays a sample: the steps are
split into strata (kind x power-of-two size bucket), every stratum gets one sample plus a
share of the rest proportional to its steps (largest remainder), and within a stratum sizes
are drawn systematically in proportion to their counts. Each sampled step carries the
weight of the steps it stands for, so weighted means estimate the whole simulation's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cgtool.specs.kinds import STEP_KINDS, StepKind

KINDS = STEP_KINDS


@dataclass(frozen=True, slots=True)
class Step:
    kind: StepKind
    size: int  # decode: requests in the batch; extend: new tokens
    context: int  # decode: tokens cached per request; extend: cached prefix of the request
    weight: float  # simulated steps this sample stands for


@dataclass(frozen=True, eq=False)
class KindPopulation:
    """Simulated steps of one kind: sizes ascending, steps at each, mean context at each."""

    sizes: np.ndarray  # [k] int64
    counts: np.ndarray  # [k] int64
    context: np.ndarray  # [k] int64

    @property
    def total(self) -> int:
        return int(self.counts.sum())


@dataclass(frozen=True, eq=False)
class StepPopulation:
    decode: KindPopulation
    extend: KindPopulation
    source: str  # "trace" (re-simulated, with contexts) or "histogram" (assumed contexts)

    def of(self, kind: str) -> KindPopulation:
        return self.decode if kind == "decode" else self.extend

    @property
    def total(self) -> int:
        return self.decode.total + self.extend.total


def kind_steps(sizes: object, counts: object, context: object) -> KindPopulation:
    s, c, x = (np.asarray(a, dtype=np.int64).reshape(-1) for a in (sizes, counts, context))
    keep = (c > 0) & (s > 0)
    order = np.argsort(s[keep], kind="stable")
    return KindPopulation(s[keep][order], c[keep][order], np.maximum(x[keep][order], 0))


def sample_steps(population: StepPopulation, num_steps: int, seed: int = 0) -> list[Step]:
    """At most `num_steps` steps (all of them when the simulation has fewer), in a seeded
    shuffled order so that sizes interleave as they do in a server."""
    rng = np.random.default_rng(seed)
    strata = _strata(population)
    if not strata or num_steps < 1:
        return []
    counts = np.array([population.of(kind).counts[idx].sum() for kind, idx in strata], float)
    allocation = _allocate(counts, min(num_steps, int(counts.sum())))
    steps: list[Step] = []
    for (kind, idx), n, total in zip(strata, allocation, counts):
        if n:
            steps += _systematic(kind, population.of(kind), idx, int(n), total, rng)
    order = rng.permutation(len(steps))
    return [steps[i] for i in order]


def _strata(population: StepPopulation) -> list[tuple[str, np.ndarray]]:
    strata = []
    for kind in KINDS:
        steps = population.of(kind)
        buckets = np.floor(np.log2(np.maximum(steps.sizes, 1))).astype(np.int64)
        for bucket in np.unique(buckets):
            strata.append((kind, np.nonzero(buckets == bucket)[0]))
    return strata


def _allocate(counts: np.ndarray, n: int) -> np.ndarray:
    """One per stratum, the rest in proportion to steps; the largest strata first when
    there are fewer samples than strata."""
    allocation = np.zeros(len(counts), dtype=np.int64)
    if n < len(counts):
        allocation[np.argsort(-counts, kind="stable")[:n]] = 1
        return allocation
    allocation += 1
    share = (n - len(counts)) * counts / counts.sum()
    allocation += np.floor(share).astype(np.int64)
    left = n - int(allocation.sum())
    remainder = share - np.floor(share)
    allocation[np.argsort(-remainder, kind="stable")[:left]] += 1
    return allocation


def _systematic(
    kind: str, steps: KindPopulation, idx: np.ndarray, n: int, total: float,
    rng: np.random.Generator,
) -> list[Step]:
    # Points spaced total/n apart over the stratum's cumulative step counts: each size is
    # drawn in proportion to how often it ran, and a size that fills a whole interval is
    # drawn at least once.
    cumulative = np.cumsum(steps.counts[idx])
    points = (rng.random() + np.arange(n)) * (total / n)
    picks = idx[np.searchsorted(cumulative, points, side="right").clip(max=len(idx) - 1)]
    weight = total / n
    return [
        Step(kind, int(steps.sizes[i]), int(steps.context[i]), float(weight)) for i in picks
    ]


def weighted_share(steps: list[Step], kind: str) -> float:
    """Share of the simulated steps (by weight) that are of `kind`."""
    total = sum(s.weight for s in steps)
    return sum(s.weight for s in steps if s.kind == kind) / total if total else 0.0
