"""How many timed calls each path of a size gets, and how sure its mean is.

Two samples of one size give one degree of freedom: Student's t is then 12.7, and the
intervals the report stated were ±20-250% for most sizes (H100, benchmarks r7) while the
calls themselves varied by a few percent. The spread of a path's calls is a property of the
path (host-bound eager launches, a GPU-bound graph) more than of one size, so it is pooled:
every sample's deviation from its own size's mean, relative to that mean, over all the
sizes of a kind that one session timed. Each mean's interval is then
t(pooled dof) x pooled relative spread x mean / sqrt(n), and a size needs only as many
calls as that pooled spread asks for.

Sizes fall in two regimes that are pooled apart, since their spread differs by a factor of
several: short calls (under `LONG_CALL_MS`, where the host's launching and its noise show)
and long ones (GPU-bound). The first sizes of a pool are timed twice until it holds
`SEED_DOF` degrees of freedom. After that a long size is timed once (the compared call): its
spread is the GPU's, steady through a run, and a second call of 25-100 ms a path was most of
what measuring cost. A short size is timed once only while the pool holds a degree of
freedom for every `LEARN_EVERY` sizes, so the pool keeps learning as the host's noise moves.
Every other size was the rule until benchmarks r9, whose H100 runs spent 17-19% of
llama-3.1-8b's measuring on the short sizes' second calls; its short pools held 18-19 degrees
of freedom (t 2.09-2.10). One size in four (r10, r11) gave 9-10 (t 2.23-2.26), and its second
calls still cost 0.37 s of the 5.2 s llama-3.1-8b measured (2026-11-24); one in six gives 6-7
(t 2.36-2.45).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from cgtool.capture.timing import t95

Regime = Literal["short", "long"]
Path = Literal["eager", "replay"]

# A size whose eager and replay calls both take this long is GPU-bound on the H100 host: an
# 8B eager step launched there in 12-25 ms (issue 14), whatever its GPU work.
LONG_CALL_MS = 25.0
SEED_DOF = 3  # degrees of freedom a long pool holds before a long size is timed once
LEARN_EVERY = 6  # a short pool takes a second call from one size in this many, once seeded


@dataclass(slots=True)
class SpreadPool:
    """Squared relative deviations of samples from their own size's mean, over sizes."""

    sum_sq: float = 0.0
    dof: int = 0
    sizes: int = 0  # sizes added, with one sample or more

    def add(self, samples: Sequence[float]) -> None:
        self.sizes += 1
        if len(samples) < 2:
            return
        mean = statistics.fmean(samples)
        self.sum_sq += sum((x / mean - 1.0) ** 2 for x in samples)
        self.dof += len(samples) - 1

    @property
    def rel_sd(self) -> float | None:
        return math.sqrt(self.sum_sq / self.dof) if self.dof else None

    def ci95_ms(self, mean_ms: float, n: int) -> float | None:
        """Half-width of the 95% interval of a mean of `n` samples; None before any spread."""
        sd = self.rel_sd
        return None if sd is None else t95(self.dof) * sd * mean_ms / math.sqrt(n)

    def samples_for(
        self, regime: Regime, call_ms: float, rel_ci: float, budget_ms: float, most: int
    ) -> int:
        """Samples one size's mean needs for its interval to be within `rel_ci` of it, if
        `budget_ms` of calls can buy them; at least one or two (the module's docstring).

        Where the budget cannot reach `rel_ci`, the size gets only its least: the calls would
        narrow an interval that misses the target anyway. That is the host-bound eager path,
        whose calls spread by up to 25% on the H100 host (`rel_sd` of `decode:eager:short`, r8, r9)
        and took three 9 ms calls a size of the budget before."""
        learning = self.dof < SEED_DOF or (regime == "short" and LEARN_EVERY * self.dof < self.sizes + 1)
        least = 2 if learning else 1
        sd = self.rel_sd
        needed = least if sd is None else math.ceil((t95(self.dof) * sd / rel_ci) ** 2)
        affordable = int(budget_ms // max(call_ms, 1e-3))
        if needed > min(affordable, most):
            return least
        return max(least, needed)


@dataclass(slots=True)
class SpreadPools:
    """One kind's pools, by path and regime; a measurement loop owns one."""

    pools: dict[tuple[Path, Regime], SpreadPool] = field(default_factory=dict)

    def pool(self, path: Path, regime: Regime) -> SpreadPool:
        return self.pools.setdefault((path, regime), SpreadPool())


@dataclass(frozen=True, slots=True)
class PathTiming:
    """One path's timed calls at one size. Its interval reads the pool it was drawn from as
    the pool stands now: later sizes add to the pool and sharpen it."""

    samples: tuple[float, ...]  # ms per call
    regime: Regime
    pool: SpreadPool

    @property
    def mean_ms(self) -> float:
        return statistics.fmean(self.samples)

    @property
    def ci95_ms(self) -> float | None:
        return self.pool.ci95_ms(self.mean_ms, len(self.samples))


def regime_of(eager_ms: float, replay_ms: float) -> Regime:
    """From the size's first call of each path: both must be long, so one call slowed by a
    pause of the host (a 7 ms replay took 32 ms once on the H100) does not move a size."""
    return "long" if min(eager_ms, replay_ms) >= LONG_CALL_MS else "short"
