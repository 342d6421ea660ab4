"""`cgtool plan --profile replay.json`: a replay's measured steps as the capture report the
profile fit reads, so the planner's step times become the ones a real loop took.

Each step's attention (the planner's estimate for its own context or query-key pairs) is taken
out, leaving its dense part; graph steps count at the size they replayed, eager steps at their
own. A size measured only one way gets the other from the roofline's eager-minus-graph gap at
that size: a replay of a planned schedule seldom runs both ways at one size.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from cgtool.replay.result import ReplayResult, is_replay_document, load_replay

_KIND = {"decode": "decode", "extend": "piecewise"}


def load_profile(path: Path) -> dict[str, Any]:
    """A capture report's dict, a verify.json's or a replay.json's made into one."""
    if is_replay_document(path):
        return replay_as_profile(load_replay(path))
    from cgtool.verify.profile import load_profile as load_other

    return load_other(path)


def replay_as_profile(result: ReplayResult) -> dict[str, Any]:
    from cgtool.planner.cost import roofline_cost
    from cgtool.specs.config import load_model_config
    from cgtool.specs.gpus import match_nvml_name

    cfg = load_model_config(result.model.name)
    gpu = match_nvml_name(result.environment.gpu_name)
    steps = result.steps
    max_bs = max([1, *(s for k, s in zip(steps.kind, steps.size) if k == "decode"), *steps.padded])
    max_tokens = max([1, *(s for k, s in zip(steps.kind, steps.size) if k == "extend"), *steps.padded])
    unit = roofline_cost(cfg, gpu, max_bs=max_bs, max_tokens=max_tokens) if gpu is not None else None
    rows = _rows(result, "decode", unit) + _rows(result, "extend", unit)
    return {
        "schema": "cgtool.report",
        "status": result.status,
        "environment": {"gpu_name": result.environment.gpu_name},
        "model": {"name": result.model.name, "config_hash": result.model.config_hash},
        "settings": {"context_len": 0, "tp_size": 1},
        "sizes": rows,
        "totals": {"graph_pool_bytes": 0, "non_torch_bytes": 0},
    }


def _rows(result: ReplayResult, kind: str, unit: Any) -> list[dict[str, Any]]:
    eager: dict[int, list[float]] = defaultdict(list)
    graph: dict[int, list[float]] = defaultdict(list)
    s = result.steps
    for k, size, padded, ms, context, pairs in zip(s.kind, s.size, s.padded, s.time_ms, s.context, s.pairs):
        if k != kind:
            continue
        attention = 0.0
        if unit is not None:
            attention = unit.kv_read_ms_per_token * context if kind == "decode" else unit.attention_ms_per_pair * pairs
        (graph[padded] if padded else eager[size]).append(max(ms - attention, 0.0))
    if not eager and not graph:
        return []
    sizes = sorted(set(eager) | set(graph))
    gap = _gap(unit, kind, np.array(sizes))
    e_ms = _at(sizes, eager, graph, gap)
    r_ms = _at(sizes, graph, eager, -gap)
    return [
        {"kind": _KIND[kind], "size": int(size), "status": "ok", "rank": 0, "eager_ms": float(e),
         "replay_ms": float(min(r, e)), "capture_s": 0.0, "retained_bytes": 0, "non_torch_bytes": 0}
        for size, e, r in zip(sizes, e_ms, r_ms)
    ]


def _gap(unit: Any, kind: str, sizes: np.ndarray) -> np.ndarray:
    """The roofline's eager minus graph dense time at each size (0 without a GPU match)."""
    if unit is None:
        return np.zeros(len(sizes))
    eager = unit.decode_eager_ms if kind == "decode" else unit.extend_eager_ms
    graph = unit.decode_graph_ms if kind == "decode" else unit.extend_graph_ms
    return np.maximum(eager[sizes] - graph[sizes], 0.0)


def _at(sizes: list[int], own: dict[int, list[float]], other: dict[int, list[float]],
        gap: np.ndarray) -> np.ndarray:
    """Mean measured ms per size; sizes measured only the other way, shifted by the gap."""
    values = []
    for k, size in enumerate(sizes):
        if own.get(size):
            values.append(float(np.mean(own[size])))
        else:
            values.append(max(float(np.mean(other[size])) + float(gap[k]), 0.0))
    return np.array(values)
