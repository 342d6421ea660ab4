"""`check`: compare two capture reports (or two plans) size by size and decide regressions."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from cgtool.documents.plan_document import Plan, PlanInputs
from cgtool.documents.results import CaptureReport, SizeResult
from cgtool.errors import InputError
from cgtool.units import MIB


@dataclass(frozen=True, slots=True)
class Metric:
    name: str
    size_field: str | None  # SizeResult attribute compared size by size
    total_field: str | None  # CaptureTotals attribute compared as the "total" row
    unit: str  # "bytes", "s", "ms" or "tokens"
    timing: bool  # timings drift between runs: judged against the looser latency threshold
    # Changes smaller than this are never a regression: a percentage of a near-zero
    # baseline says nothing (memory), or is below what CUDA events resolve (time).
    floor: float
    higher_is_worse: bool = True


REPORT_METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("retained_mem", "retained_bytes", "graph_pool_bytes", "bytes", False, MIB),
        Metric("peak_mem", "peak_bytes", "peak_bytes", "bytes", False, MIB),
        Metric("non_torch_mem", "non_torch_bytes", "non_torch_bytes", "bytes", False, MIB),
        Metric("capture_s", "capture_s", "capture_s", "s", True, 0.05),
        Metric("replay_ms", "replay_ms", None, "ms", True, 0.02),
        Metric("eager_ms", "eager_ms", None, "ms", True, 0.02),
    )
}
PLAN_METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("graph_bytes", None, "graph_bytes", "bytes", False, MIB),
        # A simulated figure, deterministic for the same trace: judged like memory.
        Metric("expected_step_ms", None, "expected_step_ms", "ms", False, 0.0),
        Metric("kv_tokens", None, "kv_tokens", "tokens", False, 0.0, higher_is_worse=False),
    )
}
# Memory is deterministic for the same code and settings, so it gates by default;
# latency is opt-in because shared CI GPUs drift by several percent between runs.
DEFAULT_REPORT_METRICS = ("retained_mem",)


@dataclass(slots=True)
class MetricChange:
    label: str  # "decode bs 8", "piecewise 512 tokens" or "total"
    metric: str
    unit: str
    baseline: float | None
    current: float | None
    threshold_pct: float
    regressed: bool
    note: str = ""  # why a row regressed without a percentage (a size that now fails)

    @property
    def change_pct(self) -> float | None:
        if self.baseline is None or self.current is None:
            return None
        if self.baseline == 0:
            return 0.0 if self.current == 0 else math.copysign(math.inf, self.current)
        return 100.0 * (self.current - self.baseline) / abs(self.baseline)


@dataclass(slots=True)
class Comparison:
    subject: str  # "report" or "plan"
    metrics: list[str]
    max_regress_pct: float
    latency_regress_pct: float
    changes: list[MetricChange]
    added: list[str] = field(default_factory=list)  # sizes only in the current run
    removed: list[str] = field(default_factory=list)  # sizes only in the baseline
    warnings: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> list[MetricChange]:
        return [c for c in self.changes if c.regressed]

    @property
    def passed(self) -> bool:
        return not self.regressions


def size_label(kind: str, size: int, rank: int = 0, hidden_mode: str = "null") -> str:
    unit = {"decode": f"bs {size}", "vit": f"{size} patches"}.get(kind, f"{size} tokens")
    mode = f" hidden {hidden_mode}" if hidden_mode != "null" else ""
    return f"{kind} {unit}{mode}" + (f" rank {rank}" if rank else "")


def compare_reports(
    baseline: CaptureReport,
    current: CaptureReport,
    metrics: list[str] | tuple[str, ...] = DEFAULT_REPORT_METRICS,
    max_regress_pct: float = 5.0,
    latency_regress_pct: float = 15.0,
    force: bool = False,
) -> Comparison:
    """Size-by-size and total changes of `metrics`; refuses other GPUs/models unless forced."""
    chosen = _pick_metrics(metrics, REPORT_METRICS, "report")
    warnings = _report_mismatches(baseline, current, force)
    result = Comparison("report", [m.name for m in chosen], max_regress_pct, latency_regress_pct,
                        [], warnings=warnings)
    base_rows = {s.key: s for s in baseline.sizes}
    cur_rows = {s.key: s for s in current.sizes}
    result.added = [size_label(*k) for k in _ordered(cur_rows.keys() - base_rows.keys())]
    result.removed = [size_label(*k) for k in _ordered(base_rows.keys() - cur_rows.keys())]
    for key in _ordered(base_rows.keys() & cur_rows.keys()):
        before, after = base_rows[key], cur_rows[key]
        status_change = _status_regression(before, after)
        if status_change:
            result.changes.append(status_change)
        for metric in chosen:
            if metric.size_field:
                result.changes.append(_change(size_label(*key), metric,
                                              getattr(before, metric.size_field),
                                              getattr(after, metric.size_field), result))
    # `totals` is rank 0's; with --tp the other ranks' totals are compared rank by rank too.
    ranks = min(len(baseline.rank_totals), len(current.rank_totals))
    pairs = [("total", baseline.totals, current.totals)] + [
        (f"total rank {r}", baseline.rank_totals[r], current.rank_totals[r]) for r in range(1, ranks)]
    for metric in (m for m in chosen if m.total_field):
        for label, before_totals, after_totals in pairs:
            result.changes.append(_change(label, metric,
                                          getattr(before_totals, metric.total_field),
                                          getattr(after_totals, metric.total_field), result))
    if current.status == "incomplete":
        result.warnings.append(f"current run is incomplete: {current.incomplete_reason}")
    return result


def compare_plans(
    baseline: Plan,
    current: Plan,
    max_regress_pct: float = 5.0,
    force: bool = False,
) -> Comparison:
    """Plan-level figures: graph memory, expected step time, KV tokens; capture sizes diffed."""
    warnings = _plan_mismatches(baseline, current, force)
    result = Comparison("plan", list(PLAN_METRICS), max_regress_pct, max_regress_pct, [],
                        warnings=warnings)
    for kind, before_sizes, after_sizes in (
        ("decode", baseline.decode.capture_bs, current.decode.capture_bs),
        ("piecewise", baseline.piecewise.capture_num_tokens, current.piecewise.capture_num_tokens),
    ):
        before, after = set(before_sizes), set(after_sizes)
        result.added += [size_label(kind, s) for s in sorted(after - before, reverse=True)]
        result.removed += [size_label(kind, s) for s in sorted(before - after, reverse=True)]
    base_figures, cur_figures = _plan_figures(baseline), _plan_figures(current)
    for metric in PLAN_METRICS.values():
        result.changes.append(_change("plan", metric, base_figures[metric.name],
                                      cur_figures[metric.name], result))
    # A plan whose simulation was stopped scored part of the trace: its figures gate nothing,
    # so comparing with it fails, with the reason, instead of passing on partial numbers.
    for side, plan in (("baseline", baseline), ("current", current)):
        if plan.status != "complete":
            result.changes.append(MetricChange("plan", "status", "", None, None, 0.0, True,
                                               note=f"the {side} plan is {plan.status}"))
            result.warnings.append(f"the {side} plan is {plan.status}: its simulation was "
                                   "stopped early, so its figures cover part of the trace")
    return result


def _plan_figures(plan: Plan) -> dict[str, float | None]:
    row = plan.row("plan")
    return {
        "graph_bytes": plan.memory.graph_bytes,
        "expected_step_ms": row.expected_step_ms if row else None,
        "kv_tokens": plan.memory.kv_tokens,
    }


def _change(label: str, metric: Metric, before: float | None, after: float | None,
            result: Comparison) -> MetricChange:
    threshold = result.latency_regress_pct if metric.timing else result.max_regress_pct
    change = MetricChange(label, metric.name, metric.unit, before, after, threshold, False)
    pct = change.change_pct
    if pct is not None and before is not None and after is not None:
        worse_pct = pct if metric.higher_is_worse else -pct
        worse_abs = (after - before) if metric.higher_is_worse else (before - after)
        change.regressed = worse_pct > threshold and worse_abs > metric.floor
    return change


def _status_regression(before: SizeResult, after: SizeResult) -> MetricChange | None:
    # A size that captured and replayed correctly before and now fails or diverges from
    # eager is a regression whatever the thresholds: the server would lose that graph.
    if before.status != "ok" or after.status == "ok":
        return None
    return MetricChange(size_label(*after.key), "status", "", None, None, 0.0, True,
                        note=f"{before.status} -> {after.status}")


def _pick_metrics(names: list[str] | tuple[str, ...], table: dict[str, Metric],
                  subject: str) -> list[Metric]:
    unknown = [n for n in names if n not in table]
    if unknown or not names:
        raise InputError(f"unknown metric {', '.join(unknown) or '(none)'} for a {subject} (--metric)",
                         f"Choose from: {', '.join(table)}.")
    return [table[n] for n in dict.fromkeys(names)]


def _report_mismatches(baseline: CaptureReport, current: CaptureReport, force: bool) -> list[str]:
    hard = []
    if baseline.environment.gpu_name != current.environment.gpu_name:
        hard.append(f"GPU differs: baseline {baseline.environment.gpu_name}, "
                    f"current {current.environment.gpu_name}")
    if baseline.model.config_hash != current.model.config_hash:
        hard.append(f"model differs: baseline {baseline.model.name} ({baseline.model.config_hash}), "
                    f"current {current.model.name} ({current.model.config_hash})")
    soft = [f"setting {name} differs: baseline {getattr(baseline.settings, name)}, "
            f"current {getattr(current.settings, name)}"
            for name in ("compiler", "mem_fraction_static", "attention_backend", "context_len",
                         "enable_cudagraph_gc", "tp_size")
            if getattr(baseline.settings, name) != getattr(current.settings, name)]
    launches = (baseline.environment.dependent_launch, current.environment.dependent_launch)
    if None not in launches and launches[0] != launches[1]:  # replay times move with it
        soft.append(f"dependent launches differ: baseline {launches[0]}, current {launches[1]}")
    return _refuse_unless_forced(hard, force) + soft


def _plan_mismatches(baseline: Plan, current: Plan, force: bool) -> list[str]:
    before, after = baseline.inputs, current.inputs
    # Another engine captures other sizes with other memory: its plan is another deployment.
    hard = [f"{name} differs: baseline {getattr(before, name)}, current {getattr(after, name)}"
            for name in ("gpu", "model", "engine") if getattr(before, name) != getattr(after, name)]
    # Memory figures are per GPU: plans over different --tp are different deployments.
    if before.tp_size != after.tp_size:
        hard.append(f"tp_size differs: baseline {before.tp_size}, current {after.tp_size}")
    traces = [before.trace, after.trace]
    # Allowed (a plan for new traffic), but then the figures answer different questions.
    soft = [f"the plans come from different traces: baseline {traces[0]}, current {traces[1]}"
            ] if traces[0] != traces[1] else []
    if before.engine == after.engine and before.engine_version != after.engine_version:
        soft.append(f"the plans compare with different {before.engine} releases' defaults: "
                    f"baseline {before.engine_version}, current {after.engine_version}")
    return _refuse_unless_forced(hard, force) + soft


def _refuse_unless_forced(mismatches: list[str], force: bool) -> list[str]:
    if mismatches and not force:
        raise InputError(f"refusing to compare: {mismatches[0]}",
                         "Compare runs of the same GPU, model and engine, or pass --force.")
    return [f"compared anyway (--force): {m}" for m in mismatches]


def _ordered(keys: Any) -> list[tuple[str, int, int]]:
    # Decode before piecewise, each largest first, as captured.
    return sorted(keys, key=lambda k: (k[0] != "decode", -k[1], k[2]))


# Below this step-time gain, new sizes are not worth a restart of a serving fleet: held out,
# the roofline's gain of a plan over the engine's default is itself about 1% (0.984-1.003 of
# the default on four real traces).
WORTH_SWITCHING = 0.01


@dataclass(frozen=True, slots=True)
class PlanVerdict:
    """--compare-plan: whether the plan's sizes beat the old plan's on this trace."""

    keep_current: bool | None  # None: no verdict, the old plan was for another deployment
    best_gain: float  # largest share of step time the new plan saves over the old sizes
    worst_gain: float  # smallest (negative: the new plan is slower somewhere)
    scenarios: int
    sentence: str


def plan_verdict(plan: Plan) -> PlanVerdict | None:
    """From the scenario rows of a plan made with --compare-plan: switch when the new sizes
    save at least WORTH_SWITCHING of the expected step somewhere and lose it nowhere."""
    part = "held_out" if any(r.part == "held_out" for r in plan.scenarios) else "fit"
    rows = {(r.load, r.eager, r.schedule): r for r in plan.scenarios if r.part == part}
    gains = {(load, eager): 1 - rows[(load, eager, "plan")].expected_step_ms / r.expected_step_ms
             for (load, eager, name), r in rows.items()
             if name == "current" and r.expected_step_ms > 0 and (load, eager, "plan") in rows}
    if not gains:
        return None
    (best_at, best), (worst_at, worst) = max(gains.items(), key=lambda g: g[1]), min(
        gains.items(), key=lambda g: g[1])
    where = "held-out" if part == "held_out" else "simulated"
    other = next((w for w in plan.warnings if w.startswith(OTHER_DEPLOYMENT)), None)
    if other is not None:
        differ = other.removeprefix(OTHER_DEPLOYMENT).split(";")[0].lstrip(": ")
        return PlanVerdict(None, best, worst, len(gains),
                           f"no verdict: the old plan was made for another deployment ({differ}); "
                           "compare a plan of the same model, engine, GPU and --tp")

    def at(key: tuple[float, str]) -> str:
        return f"{key[0]:g}x load, {key[1]} eager cost"

    if best >= WORTH_SWITCHING and worst > -WORTH_SWITCHING:
        sentence = (f"take the new plan: its {where} expected step is {best:.1%} shorter than "
                    f"your current sizes' at {at(best_at)}" + (
                        f" and {-worst:.1%} longer at worst ({at(worst_at)})" if worst < 0 else ""))
        return PlanVerdict(False, best, worst, len(gains), sentence)
    if best >= WORTH_SWITCHING:
        reason = (f"the new plan is {best:.1%} faster at {at(best_at)} but {-worst:.1%} slower "
                  f"at {at(worst_at)}")
    else:
        reason = (f"the new plan saves at most {max(best, 0.0):.1%} of the {where} expected step "
                  f"({at(best_at)}), under the {WORTH_SWITCHING:.0%} worth a restart")
    return PlanVerdict(True, best, worst, len(gains), f"keep your current sizes: {reason}")


OTHER_DEPLOYMENT = "--compare-plan's plan was made for another deployment"


def compare_plan_warnings(old: Plan, new_inputs: PlanInputs) -> list[str]:
    """What differs between the plan passed to --compare-plan and the plan being made: its
    sizes are scored here all the same, but were chosen for another deployment."""
    before = old.inputs
    names = ("model", "engine", "gpu", "tp_size")
    differ = [f"{name} {getattr(before, name)} (now {getattr(new_inputs, name)})"
              for name in names if getattr(before, name) != getattr(new_inputs, name)]
    if not differ:
        return []
    return [(f"{OTHER_DEPLOYMENT}: {', '.join(differ)}; its sizes and KV tokens are scored here "
             "as they are, which says little about them")]
