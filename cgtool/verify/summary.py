"""From raw per-step timings to verify.json's figures: weighted means, the plan/default ratio
with its confidence interval over repeats, and the exit code."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from cgtool.documents.plan_document import Plan
from cgtool.planner.cost import CostModel
from cgtool.verify.population import predicted_ms
from cgtool.verify.result import KindTiming, Ratio, SetResult, SizeTiming, VerifyResult
from cgtool.verify.steps import Step

CONFIDENCE = 0.95
# Two-sided 95% Student t quantiles by degrees of freedom (1..30); beyond 30 the normal's.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


@dataclass
class SetMeasurement:
    """What the GPU session measured for one graph set."""

    name: str  # "plan" or "default"
    capture_bs: list[int]  # sizes captured (those that failed are left out)
    capture_num_tokens: list[int]
    failed_sizes: list[str]
    capture_s: float
    compile_s: float
    graph_bytes: int
    step_ms: list[list[float]]  # [repeat][sampled step], in the order of the sample
    # MLA decode chunks done twice over the timed repeats (attention.redone_chunks); None
    # where nothing counts them (not an MLA model, or its Hopper kernel does not serve)
    mla_chunks_redone: int | None = None


def t_quantile(df: int) -> float:
    return _T95[df - 1] if df <= len(_T95) else 1.96


def ratio_interval(plan_means: list[float], default_means: list[float]) -> Ratio:
    """Paired per repeat: each repeat ran both sets back to back, so drift cancels in its
    ratio; the interval is Student's t over the repeats' ratios."""
    ratios = [p / d for p, d in zip(plan_means, default_means)]
    mean = float(np.mean(ratios))
    if len(ratios) < 2:
        half = math.inf
    else:
        half = t_quantile(len(ratios) - 1) * float(np.std(ratios, ddof=1)) / math.sqrt(len(ratios))
    low, high = mean - half, mean + half
    verdict = "slower" if low > 1.0 else "faster" if high < 1.0 else "same"
    finite = (lambda v: v if math.isfinite(v) else (0.0 if v < 0 else 1e9))
    return Ratio(mean, finite(low), finite(high), CONFIDENCE, ratios, verdict)


def weighted_mean(values: np.ndarray, weights: np.ndarray) -> float:
    total = float(weights.sum())
    return float((values * weights).sum() / total) if total else 0.0


def summarise_set(
    measured: SetMeasurement, steps: list[Step], cost: CostModel, plan: Plan
) -> SetResult:
    weights = np.array([s.weight for s in steps])
    times = np.array(measured.step_ms, dtype=np.float64)  # [repeats, steps]
    predicted, graphs = [], []
    for step in steps:
        captured = measured.capture_bs if step.kind == "decode" else measured.capture_num_tokens
        ms, graph = predicted_ms(cost, step, captured)
        predicted.append(ms)
        graphs.append(graph)
    predicted_arr, per_step = np.array(predicted), times.mean(axis=0)
    row = plan.row(measured.name)
    assert row is not None, f"plan.json has no {measured.name} row"
    repeats = [weighted_mean(t, weights) for t in times]
    return SetResult(
        name=measured.name,  # type: ignore[arg-type]
        capture_bs=measured.capture_bs,
        capture_num_tokens=measured.capture_num_tokens,
        failed_sizes=measured.failed_sizes,
        capture_s=measured.capture_s,
        compile_s=measured.compile_s,
        graph_bytes=measured.graph_bytes,
        predicted_graph_bytes=row.graph_bytes,
        predicted_capture_s=row.capture_s,
        mean_step_ms=float(np.mean(repeats)),
        repeat_step_ms=repeats,
        predicted_step_ms=weighted_mean(predicted_arr, weights),
        plan_expected_step_ms=row.expected_step_ms,
        kinds=_kinds(steps, weights, per_step, predicted_arr),
        sizes=_sizes(steps, per_step, predicted_arr, graphs),
        mla_chunks_redone=measured.mla_chunks_redone,
    )


def _kinds(steps: list[Step], weights: np.ndarray, measured: np.ndarray,
           predicted: np.ndarray) -> list[KindTiming]:
    rows = []
    for kind in ("decode", "extend"):
        mask = np.array([s.kind == kind for s in steps], dtype=bool)
        if mask.any():
            w = weights[mask]
            rows.append(KindTiming(kind, float(w.sum()), weighted_mean(measured[mask], w),  # type: ignore[arg-type]
                                   weighted_mean(predicted[mask], w)))
    return rows


def _sizes(steps: list[Step], measured: np.ndarray, predicted: np.ndarray,
           graphs: list[int]) -> list[SizeTiming]:
    groups: dict[tuple[str, int], list[int]] = defaultdict(list)
    for i, step in enumerate(steps):
        groups[(step.kind, step.size)].append(i)
    rows = []
    for (kind, size), idx in sorted(groups.items()):
        rows.append(SizeTiming(
            kind=kind, size=size, steps=len(idx),  # type: ignore[arg-type]
            context=round(sum(steps[i].context for i in idx) / len(idx)),
            weight=float(sum(steps[i].weight for i in idx)), graph_size=graphs[idx[0]],
            measured_ms=float(measured[idx].mean()), predicted_ms=float(predicted[idx].mean()),
        ))
    return rows


def verify_exit_code(result: VerifyResult) -> int:
    """1 when the plan's memory rehearsal ran out of memory or the plan measured slower than
    the default beyond the noise between repeats; else 0."""
    slower = result.ratio is not None and result.ratio.verdict == "slower"
    return int(result.status == "oom" or slower)
