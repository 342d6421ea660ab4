"""`cgtool plan --profile replay.json`: a replay's measured steps as the capture report the
profile fit reads, so the planner's step times become the ones a real loop took.

Attention's cost is fitted to the replay's own steps: among steps that ran one graph (or one
eager size) the dense part is the same and only the context read (decode) or the query-key
pairs (extend) vary, so the slope there is attention's price, which the report carries as
`attention` for the profile fit to use instead of the roofline's. Taking it out leaves each
step's dense part; graph steps count at the size they replayed, eager steps at their own. A size
measured only one way gets the other from the roofline's eager-minus-graph gap at that size:
a replay of a planned schedule seldom runs both ways at one size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from cgtool.errors import InputError
from cgtool.planner.profile_fit import within_slope
from cgtool.replay.result import ReplayResult, is_replay_document, load_replay
from cgtool.specs.kinds import GRAPH_KIND_OF_STEP


def load_profile(path: Path) -> dict[str, Any]:
    """A capture report's dict, a verify.json's or a replay.json's made into one."""
    if is_replay_document(path):
        return replay_as_profile(load_replay(path))
    from cgtool.verify.profile import load_profile as load_other

    return load_other(path)


def load_profiles(paths: list[Path]) -> dict[str, Any]:
    """One profile from one file (`load_profile`), or from capture reports of one model on one
    GPU at different --context-len, merged so that decode attention is priced across their
    contexts (cgtool.planner.profile_fit.merge_context_reports)."""
    if len(paths) == 1:
        return load_profile(paths[0])
    from cgtool.planner.profile_fit import merge_context_reports

    reports = [load_profile(path) for path in paths]
    for path, report in zip(paths, reports):
        if "memory_proof" in report or "attention" in report or not report.get("sizes"):
            raise InputError(f"--profile {path}: only capture reports can be merged",
                             "Pass one verify.json or replay.json alone, or several capture report.json files.")
    first = _identity(reports[0])
    for path, report in zip(paths[1:], reports[1:]):
        if _identity(report) != first:
            raise InputError(f"--profile {path}: another model or GPU than {paths[0]} ({' on '.join(first)})",
                             "Merge captures of one model on one GPU, each at its own --context-len.")
    return merge_context_reports(reports)


def _identity(report: dict[str, Any]) -> tuple[str, str]:
    model = report.get("model") or {}
    return str(model.get("name")), str((report.get("environment") or {}).get("gpu_name"))


def replay_as_profile(result: ReplayResult) -> dict[str, Any]:
    from cgtool.planner.cost import roofline_cost
    from cgtool.specs.config import load_model_config
    from cgtool.specs.gpus import match_nvml_name

    cfg = load_model_config(result.model.name)
    gpu = match_nvml_name(result.environment.gpu_name)
    steps = result.steps
    max_tokens = max([1, *(s for k, s in zip(steps.kind, steps.size) if k == "extend"), *steps.padded])
    max_bs = max([1, *(s for k, s in zip(steps.kind, steps.size) if k == "decode"), *steps.padded])
    unit = roofline_cost(cfg, gpu, max_bs=max_bs, max_tokens=max_tokens) if gpu is not None else None
    decode_rows, kv_ms = _rows(result, "decode", unit)
    extend_rows, pair_ms = _rows(result, "extend", unit)
    attention = {}
    if kv_ms is not None:
        attention["kv_read_ms_per_token"] = kv_ms
    if pair_ms is not None:
        attention["attention_ms_per_pair"] = pair_ms
    if unit is not None:
        # profile_fit takes a one-request causal prefill's attention (its roofline estimate) out
        # of each piecewise row; these rows are dense already, so it is added back first.
        for row in extend_rows:
            causal = unit.attention_ms_per_pair * row["size"] * (row["size"] + 1) / 2
            row["eager_ms"] += causal
            row["replay_ms"] += causal
    return {
        "schema": "cgtool.report",
        "status": result.status,
        "environment": {"gpu_name": result.environment.gpu_name},
        "model": {"name": result.model.name, "config_hash": result.model.config_hash},
        "settings": {"context_len": 0, "tp_size": 1},
        "sizes": decode_rows + extend_rows,
        "attention": attention,
        "totals": {"graph_pool_bytes": 0, "non_torch_bytes": 0},
    }


def _rows(result: ReplayResult, kind: str, unit: Any) -> tuple[list[dict[str, Any]], float | None]:
    """Dense rows per size and the attention coefficient (ms per context token for decode, per
    query-key pair for extend) fitted to the replay's own steps."""
    s = result.steps
    pick = np.array([k == kind for k in s.kind], dtype=bool)
    if not pick.any():
        return [], None
    size = np.array(s.size, dtype=np.int64)[pick]
    padded = np.array(s.padded, dtype=np.int64)[pick]
    ms = np.array(s.time_ms, dtype=np.float64)[pick]
    load = np.array(s.context if kind == "decode" else s.pairs, dtype=np.float64)[pick]
    # Steps of one graph (or one eager size) share their dense part; within such a group only
    # the attention work varies, so its slope there is attention's cost (a fixed-effects fit).
    group = np.where(padded > 0, padded, -size)
    slope = within_slope(group, load, ms)
    if slope is None and unit is not None:
        slope = unit.kv_read_ms_per_token if kind == "decode" else unit.attention_ms_per_pair
    dense = ms - (slope or 0.0) * load
    eager = {int(-g): float(np.mean(dense[group == g])) for g in np.unique(group) if g < 0}
    graph = {int(g): float(np.mean(dense[group == g])) for g in np.unique(group) if g > 0}
    counts = {abs(int(g)): int(np.count_nonzero(group == g)) for g in np.unique(group)}
    sizes = _spread(sorted(set(eager) | set(graph)), counts)
    gap = _gap(unit, kind, np.array(sizes))
    e_ms = _at(sizes, eager, graph, gap)
    r_ms = _at(sizes, graph, eager, -gap)
    rows = [
        {"kind": GRAPH_KIND_OF_STEP[kind], "size": int(n), "status": "ok", "rank": 0, "eager_ms": float(max(e, 0.0)),
         "replay_ms": float(max(min(r, e), 0.0)), "capture_s": 0.0, "retained_bytes": 0, "non_torch_bytes": 0}
        for n, e, r in zip(sizes, e_ms, r_ms)
    ]
    return rows, slope


# Sizes closer than this share are one point: the profile fit extends its tables beyond the
# largest size along the last two points' slope, and two near sizes (a graph of 4,096 tokens and
# one eager step of 4,107) would make that slope noise.
_MIN_SIZE_STEP = 0.05


def _spread(sizes: list[int], counts: dict[int, int]) -> list[int]:
    """Of sizes within _MIN_SIZE_STEP of each other, the one with the most steps."""
    kept: list[int] = []
    for size in sizes:
        if kept and size < kept[-1] * (1 + _MIN_SIZE_STEP):
            if counts[size] > counts[kept[-1]]:
                kept[-1] = size
            continue
        kept.append(size)
    return kept


def _gap(unit: Any, kind: str, sizes: np.ndarray) -> np.ndarray:
    """The roofline's eager minus graph dense time at each size (0 without a GPU match)."""
    if unit is None or not len(sizes):
        return np.zeros(len(sizes))
    eager = unit.decode_eager_ms if kind == "decode" else unit.extend_eager_ms
    graph = unit.decode_graph_ms if kind == "decode" else unit.extend_graph_ms
    return np.maximum(eager[sizes] - graph[sizes], 0.0)


def _at(sizes: list[int], own: dict[int, float], other: dict[int, float], gap: np.ndarray) -> np.ndarray:
    """Mean dense ms per size; sizes measured only the other way, shifted by the gap."""
    return np.array([own[n] if n in own else other[n] + float(gap[k]) for k, n in enumerate(sizes)])
