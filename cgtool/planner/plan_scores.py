"""Scores of the plan, the default and an existing plan on every scenario, fit and held out."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from cgtool.documents.plan_document import PlanMemory, ScenarioScore, ScheduleScore
from cgtool.planner.eager import EagerAssumption
from cgtool.planner.request import PlanRequest
from cgtool.planner.robust import RobustChoice, Scenario, Schedule, scenario_score
from cgtool.planner.server import Server

# Below this share of decode steps on a graph, the plan says how many run eagerly.
FULL_COVERAGE = 0.99


@dataclass(frozen=True, eq=False)
class ScoreSet:
    # (part, load, eager assumption, schedule name) -> score
    scores: dict[tuple[str, float, str, str], ScheduleScore]
    headline_part: str  # "held_out", or "fit" when nothing was held out
    first_load: float
    first_eager: str

    @classmethod
    def build(
        cls,
        schedules: list[tuple[Schedule, int]],
        fit: list[Scenario],
        held: list[Scenario],
        assumptions: tuple[EagerAssumption, ...],
    ) -> ScoreSet:
        """Every schedule (with its KV pool) scored on every scenario under every assumption."""
        has_held = any(sc.decode.counts.sum() + sc.extend.counts.sum() for sc in held)
        parts = [("fit", fit)] + ([("held_out", held)] if has_held else [])
        scores = {}
        for part, scenarios in parts:
            for sc in scenarios:
                for a in assumptions:
                    for schedule, kv in schedules:
                        key = (part, sc.load, a.name, schedule.name)
                        scores[key] = scenario_score(schedule.name, sc, a, schedule, kv)
        return cls(scores, "held_out" if has_held else "fit", fit[0].load, assumptions[0].name)

    def pair(self, part: str) -> list[ScheduleScore]:
        key = (part, self.first_load, self.first_eager)
        return [self.scores[key + ("plan",)], self.scores[key + ("default",)]]

    @property
    def headline(self) -> list[ScheduleScore]:
        return self.pair(self.headline_part)

    @property
    def headline_fit(self) -> list[ScheduleScore]:
        return self.pair("fit")

    def of(self, part: str) -> dict[tuple[float, str, str], ScheduleScore]:
        return {k[1:]: v for k, v in self.scores.items() if k[0] == part}


def compared_schedules(
    req: PlanRequest, server: Server, choice: RobustChoice, memory: PlanMemory
) -> list[tuple[Schedule, int]]:
    """The plan, the engine's default and an existing plan (--compare-plan), each with the KV
    pool it runs with."""
    d = server.default
    schedules = [
        (Schedule("plan", tuple(choice.decode_bs), tuple(choice.tokens)), memory.kv_tokens),
        (Schedule("default", d.decode_bs, d.piecewise_tokens, d.pads), server.default_kv_tokens),
    ]
    if req.compare is not None:
        schedules.append((Schedule("current", req.compare[0], req.compare[1]), req.compare[2]))
    return schedules


def score_rows(scores: ScoreSet) -> list[ScenarioScore]:
    """plan.json's `scenarios`: one row per part, load, eager assumption and schedule."""
    return [
        ScenarioScore(part=part, load=load, eager=eager, **asdict(score))  # type: ignore[arg-type]
        for (part, load, eager, _), score in scores.scores.items()
    ]


def plan_warnings(scores: ScoreSet, req: PlanRequest) -> list[str]:
    part = scores.headline_part
    rows = scores.of(part)
    where = "held-out" if part == "held_out" else "simulated"
    notes = []
    slower = [
        f"{rows[(load, eager, 'plan')].expected_step_ms / row.expected_step_ms:.3f}x at "
        f"{load:g}x load, {eager} eager cost"
        for (load, eager, name), row in rows.items()
        if name == "default"
        and rows[(load, eager, "plan")].expected_step_ms > row.expected_step_ms * (1 + 1e-9)
    ]
    if slower:
        budget = " (the budgets given)" if req.budget_graphs or req.budget_memory_bytes else ""
        notes.append(
            f"the plan's {where} expected step is slower than the default's{budget}: "
            + "; ".join(slower)
        )
    eager_steps = {
        load: row
        for (load, eager, name), row in rows.items()
        if name == "plan" and row.decode_coverage < FULL_COVERAGE
    }
    for load, row in eager_steps.items():
        costs = ", ".join(
            f"{rows[(load, e, 'plan')].expected_step_ms:.2f} ms ({e} eager cost)"
            for (lo, e, n) in rows
            if lo == load and n == "plan"
        )
        notes.append(
            f"at {load:g}x load {1 - row.decode_coverage:.1%} of {where} decode steps run "
            f"eagerly (beyond the graphs the limits or budgets allow); expected step {costs}"
        )
    return notes
