"""`check` on two verify.json files: the CI gate on what verify proved about memory.

A change fails when the proven headroom (free memory at the worst step, at the recommended
fraction) shrinks, the recommended fraction drops, or the plan's graph memory (measured, or
predicted) grows, beyond the threshold; and when the current run proved no fraction at all.
"""

from __future__ import annotations

from cgtool.documents.compare import Comparison, Metric, MetricChange
from cgtool.units import MIB
from cgtool.verify.result import VerifyResult

VERIFY_METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        # Headroom is a difference of large figures: below 64 MiB a change is noise.
        Metric("proven_headroom", None, None, "bytes", False, 64 * MIB, higher_is_worse=False),
        Metric("mem_fraction_static", None, None, "", False, 0.0, higher_is_worse=False),
        Metric("graph_bytes", None, None, "bytes", False, MIB),
        Metric("predicted_graph_bytes", None, None, "bytes", False, MIB),
    )
}


def proven_figures(result: VerifyResult) -> dict[str, float | None]:
    """The figures the gate compares; the headroom is the recommended fraction's rehearsal."""
    fraction = result.recommended_mem_fraction_static
    rehearsals = [(result.settings.mem_fraction_static, result.rehearsal)]
    if result.proof is not None:
        rehearsals.append((result.proof.mem_fraction_static, result.proof.rehearsal))
    headroom = next((r.headroom_bytes for f, r in rehearsals if f == fraction and r.status == "ok"), None)
    plan = result.set("plan")
    return {
        "proven_headroom": headroom,
        "mem_fraction_static": fraction,
        "graph_bytes": plan.graph_bytes if plan else None,
        "predicted_graph_bytes": plan.predicted_graph_bytes if plan else None,
    }


def compare_verifies(baseline: VerifyResult, current: VerifyResult, max_regress_pct: float = 5.0) -> Comparison:
    result = Comparison("verify", list(VERIFY_METRICS), max_regress_pct, max_regress_pct, [])
    if (baseline.model.name, baseline.environment.gpu_name) != (current.model.name, current.environment.gpu_name):
        result.warnings.append(
            f"baseline is {baseline.model.name} on {baseline.environment.gpu_name}, current "
            f"{current.model.name} on {current.environment.gpu_name}: the figures are not comparable")
    before, after = proven_figures(baseline), proven_figures(current)
    for metric in VERIFY_METRICS.values():
        result.changes.append(_change(metric, before[metric.name], after[metric.name], max_regress_pct))
    if current.recommended_mem_fraction_static is None:
        result.changes.append(MetricChange("verify", "mem_fraction_static", "", None, None, 0.0, True,
                                           note="the current verify proved no fraction"))
    return result


def _change(metric: Metric, before: float | None, after: float | None, threshold: float) -> MetricChange:
    change = MetricChange("verify", metric.name, metric.unit, before, after, threshold, False)
    pct = change.change_pct
    if pct is not None and before is not None and after is not None:
        worse_pct = pct if metric.higher_is_worse else -pct
        worse_abs = (after - before) if metric.higher_is_worse else (before - after)
        change.regressed = worse_pct > threshold and worse_abs > metric.floor
    return change
