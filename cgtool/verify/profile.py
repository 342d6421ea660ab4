"""`cgtool plan --profile verify.json`: a verification as the capture report the profile fit
reads, so predictions learn from what verify measured.

Each measured step is turned into its dense part (the planner's attention estimate for its
own context taken out), then eager points (steps that ran eagerly, at their size) and
replay points (steps on a graph, at the graph's size) become per-size rows at context 0.
Capture time and graph memory are the plan set's, spread evenly over its graphs.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from cgtool.documents.results import load_report
from cgtool.specs.kinds import GRAPH_KIND_OF_STEP
from cgtool.verify.result import (
    SetResult,
    SizeTiming,
    VerifyResult,
    is_verify_document,
    load_verify,
)



def load_profile(path: Path) -> dict[str, Any]:
    """A capture report's dict, or a verify.json made into one."""
    if is_verify_document(path):
        return verify_as_profile(load_verify(path))
    return load_report(path).to_dict()


def verify_as_profile(result: VerifyResult) -> dict[str, Any]:
    from cgtool.specs.config import load_model_config
    from cgtool.specs.gpus import GpuSpec, match_nvml_name
    from cgtool.planner.cost import roofline_cost

    cfg = load_model_config(result.model.name)
    gpu: GpuSpec | None = match_nvml_name(result.environment.gpu_name)
    unit = roofline_cost(cfg, gpu, max_bs=1, max_tokens=1) if gpu is not None else None
    rows: list[dict[str, Any]] = []
    for kind in ("decode", "extend"):
        rows += _rows(result.sets, kind, unit)
    if unit is not None:
        # profile_fit takes a one-request causal prefill's attention out of each piecewise
        # row; these rows are dense already, so it is added back first (as replay's are).
        for row in rows:
            if row["kind"] == "piecewise":
                causal = unit.attention_ms_per_pair * row["size"] * (row["size"] + 1) / 2
                row["eager_ms"] += causal
                row["replay_ms"] += causal
    plan_set = result.set("plan")
    graphs = len(plan_set.capture_bs) + len(plan_set.capture_num_tokens) if plan_set else 0
    per_graph = plan_set.capture_s / graphs if plan_set and graphs else 0.0
    for row in rows:
        row["capture_s"] = per_graph
    return {
        "schema": "cgtool.report",
        "status": "complete",
        "environment": {"gpu_name": result.environment.gpu_name},
        "model": {"name": result.model.name, "config_hash": result.model.config_hash},
        "settings": {"context_len": 0, "tp_size": 1},
        "sizes": rows,
        "totals": {"graph_pool_bytes": plan_set.graph_bytes if plan_set else 0, "non_torch_bytes": 0},
        "memory_proof": memory_proof(result),
    }


def memory_proof(result: VerifyResult) -> dict[str, Any]:
    """What verify proved about --mem-fraction-static, for the planner to recommend
    (cgtool.planner.proven): the fraction that passed, and every fraction that failed."""
    tried = [(result.settings.mem_fraction_static, result.rehearsal)]
    if result.proof is not None:
        tried.append((result.proof.mem_fraction_static, result.proof.rehearsal))
    return {
        "model": result.model.name,
        "gpu_name": result.environment.gpu_name,
        "recommended_mem_fraction_static": result.recommended_mem_fraction_static,
        "failed_mem_fraction_static": sorted(f for f, r in tried if r.status == "oom"),
        "headroom_bytes": max((r.headroom_bytes for f, r in tried
                               if f == result.recommended_mem_fraction_static and r.status == "ok"), default=0),
    }


def _rows(sets: list[SetResult], kind: str, unit: Any) -> list[dict[str, Any]]:
    eager: dict[int, list[float]] = defaultdict(list)
    replay: dict[int, list[float]] = defaultdict(list)
    for graph_set in sets:
        for row in graph_set.sizes:
            if row.kind != kind:
                continue
            dense = row.measured_ms - _attention_ms(unit, row.kind, row.size, row)
            (replay[row.graph_size] if row.graph_size else eager[row.size]).append(max(dense, 0.0))
    if not eager or not replay:
        return []  # both are needed per size; the roofline fills the kind instead
    sizes = sorted(set(eager) | set(replay))
    e_sizes, r_sizes = sorted(eager), sorted(replay)
    e_ms = np.interp(sizes, e_sizes, [float(np.mean(eager[s])) for s in e_sizes])
    r_ms = np.interp(sizes, r_sizes, [float(np.mean(replay[s])) for s in r_sizes])
    return [
        {"kind": GRAPH_KIND_OF_STEP[kind], "size": int(s), "status": "ok", "rank": 0, "eager_ms": float(e),
         "replay_ms": float(min(r, e)), "capture_s": 0.0, "retained_bytes": 0, "non_torch_bytes": 0}
        for s, e, r in zip(sizes, e_ms, r_ms)
    ]


def _attention_ms(unit: Any, kind: str, size: int, row: SizeTiming) -> float:
    """The planner's attention estimate for the steps' own context: no schedule changes it."""
    if unit is None:
        return 0.0
    if kind == "decode":
        return float(unit.kv_read_ms_per_token * size * row.context)
    return float(unit.attention_ms_per_pair * (size * row.context + size * (size + 1) / 2))
