"""`cgtool plan --profile verify.json`: a verification as the capture report the profile fit
reads, so predictions learn from what verify measured.

Each measured step is turned into its dense part (the planner's attention estimate for its
own context taken out; extend steps over long prefixes instead set the price of that
attention), then eager points (steps that ran eagerly, at their size) and
replay points (steps on a graph, at the graph's size) become per-size rows at context 0.
A kind whose steps all replayed (the graphs covered the trace, as they usually do) takes its
eager side from the roofline's gap between an eager and a replayed step of each size, and one
whose steps all ran eagerly its replay side the same way: without it that kind learned
nothing, and the plan kept the roofline. Eager times not measured are marked
(`eager_measured`), so the plan keeps its low and high eager assumptions around them. Capture time and graph memory are the plan set's,
spread evenly over its graphs.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from cgtool.documents.results import load_report
from cgtool.planner.profile_fit import size_table
from cgtool.planner.step_time import attention_pairs
from cgtool.specs.kinds import GRAPH_KIND_OF_STEP
from cgtool.verify.result import (
    SetResult,
    SizeTiming,
    VerifyResult,
    is_verify_document,
    load_verify,
)

# An extend step teaches its size's dense part only when its cached prefix is at most
# MAX_PREFIX_PER_NEW_TOKEN times its new tokens and the attention taken out of it at most
# MAX_ATTENTION_SHARE of its time: otherwise what is left is mostly the attention estimate's
# error. The estimate prices query-key pairs, and a few new tokens over a long prefix take the
# time of reading the prefix instead. A Mooncake verify on the H100 measured 14 new tokens over a
# 24,576-token prefix at 73.7 ms, where the estimate put 26.0. Learning from every step, its
# profile put the Azure example's extend steps at twice their measured time
# (benchmarks/results/h100-2026-11-26-pdl-tails/call4, `benchmarks/repredict_verify.py
# --profile-from other-trace`).
MAX_PREFIX_PER_NEW_TOKEN = 4
MAX_ATTENTION_SHARE = 0.5
# Those steps still say what their attention cost: once the other steps have taught the dense
# part, the price of a query-key pair is scaled so that the long-prefix steps, weighted as verify
# weighs them, come out at their measured mean. Without it a Mooncake profile left deepseek-v2-lite's
# extend steps 9-11% slow (the six runs of tests/test_verify_profile.py). The dense parts they
# leave depend on the price, so the two are settled together in a few rounds.
PAIR_PRICE_ROUNDS = 4
MIN_PAIR_PRICE_SCALE = 0.25


def load_profile(path: Path) -> dict[str, Any]:
    """A capture report's dict, or a verify.json made into one."""
    if is_verify_document(path):
        return verify_as_profile(load_verify(path))
    return load_report(path).to_dict()


def _seconds_a_graph(result: VerifyResult) -> list[tuple[str, float]]:
    """(set, seconds recording a graph) of each set with graphs, in capture order."""
    return [(s.name, s.capture_s / graphs) for s in result.sets
            if (graphs := len(s.capture_bs) + len(s.capture_num_tokens))]


def warm_capture_s_a_graph(result: VerifyResult) -> float:
    """Seconds recording a graph, the least over verify's sets. The set captured first in the
    process (the plan's) also compiles cgtool's Triton kernels where the disk cache lacks them;
    the plan predicts a server's capture, kernels compiled. deepseek-v2-lite on an H200 with a
    cold cache (2026-11-28): the plan's set 1.05 s a graph, the default's, captured second,
    0.19 s."""
    return min((rate for _, rate in _seconds_a_graph(result)), default=0.0)


def first_capture_note(result: VerifyResult, ratio: float = 2.0) -> str | None:
    """A note where the set captured first took over `ratio` times the other's seconds a graph,
    as where it compiled cgtool's kernels (see warm_capture_s_a_graph); else None."""
    rates = _seconds_a_graph(result)
    if len(rates) < 2:
        return None
    (first, slow), fast = rates[0], min(rate for _, rate in rates[1:])
    if slow <= ratio * fast:
        return None
    return (f"the {first} set, captured first, took {slow:.2f} s a graph against {fast:.2f}: its capture "
            f"also compiled kernels the Triton cache lacked, which a server's capture (the prediction) "
            f"has compiled; `plan --profile` prices a graph at {fast:.2f} s")


def verify_as_profile(result: VerifyResult) -> dict[str, Any]:
    from cgtool.planner.cost import roofline_cost
    from cgtool.specs.config import load_model_config
    from cgtool.specs.gpus import GpuSpec, match_nvml_name

    cfg = load_model_config(result.model.name)
    gpu: GpuSpec | None = match_nvml_name(result.environment.gpu_name)
    unit = None
    if gpu is not None:
        # Replayed steps count at their graph's size, which padding makes larger than theirs.
        largest = {kind: max((max(r.size, r.graph_size) for s in result.sets for r in s.sizes if r.kind == kind),
                             default=1) for kind in ("decode", "extend")}
        unit = roofline_cost(cfg, gpu, max_bs=largest["decode"], max_tokens=largest["extend"])
    rows: list[dict[str, Any]] = []
    eager_measured = True
    pair_ms = _long_prefix_pair_ms(result.sets, unit)
    for kind in ("decode", "extend"):
        kind_rows, measured = _rows(result.sets, kind, unit, pair_ms)
        rows += kind_rows
        eager_measured = eager_measured and (measured or not kind_rows)
    if unit is not None:
        # profile_fit takes a one-request causal prefill's attention out of each piecewise
        # row; these rows are dense already, so it is added back first (as replay's are).
        for row in rows:
            if row["kind"] == "piecewise":
                causal = unit.attention_ms_per_pair * row["size"] * (row["size"] + 1) / 2
                row["eager_ms"] += causal
                row["replay_ms"] += causal
    plan_set = result.set("plan")
    per_graph = warm_capture_s_a_graph(result)
    for row in rows:
        row["capture_s"] = per_graph
    return {
        "schema": "cgtool.report",
        "status": "complete",
        "environment": {"gpu_name": result.environment.gpu_name},
        "model": {"name": result.model.name, "config_hash": result.model.config_hash},
        "settings": {"context_len": 0, "tp_size": 1},
        "sizes": rows,
        "attention": {} if pair_ms is None else {"attention_ms_per_pair": pair_ms},
        "eager_measured": eager_measured,
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


def _rows(sets: list[SetResult], kind: str, unit: Any,
          pair_ms: float | None) -> tuple[list[dict[str, Any]], bool]:
    """A kind's rows, and whether their eager times were measured."""
    points, measured = _dense_table(sets, kind, unit, pair_ms)
    return [
        {"kind": GRAPH_KIND_OF_STEP[kind], "size": int(s), "status": "ok", "rank": 0, "eager_ms": float(e),
         "replay_ms": float(min(r, e)), "capture_s": 0.0, "retained_bytes": 0, "non_torch_bytes": 0}
        for s, e, r in points
    ], measured


def _dense_table(sets: list[SetResult], kind: str, unit: Any,
                 pair_ms: float | None) -> tuple[list[tuple[int, float, float]], bool]:
    """(size, eager dense ms, replay dense ms) for the sizes a kind taught, and whether its
    eager times were measured."""
    eager, replay = _dense_points(sets, kind, unit, pair_ms)
    measured = bool(eager)
    if not eager and not replay:
        return [], True  # the roofline fills the kind
    if not eager or not replay:
        if unit is None:
            return [], True
        # One side measured: the other is it moved by the roofline's eager-over-replay gap.
        gap = _eager_gap(unit, kind)
        if not eager:
            eager = {s: [v + gap[s] for v in values] for s, values in replay.items()}
        else:
            replay = {s: [max(v - gap[s], 0.0) for v in values] for s, values in eager.items()}
    sizes = sorted(set(eager) | set(replay))
    e_sizes, r_sizes = sorted(eager), sorted(replay)
    e_ms = np.interp(sizes, e_sizes, [float(np.mean(eager[s])) for s in e_sizes])
    r_ms = np.interp(sizes, r_sizes, [float(np.mean(replay[s])) for s in r_sizes])
    points = list(zip(sizes, e_ms, r_ms))
    if unit is not None:
        points = _below_first(unit, kind, points) + points
    return points, measured


def _dense_points(sets: list[SetResult], kind: str, unit: Any,
                  pair_ms: float | None) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    """(eager, replay): each size's dense times, eager steps at their size, replayed ones at
    their graph's, less attention (extend's at `pair_ms` a pair where given). Extend steps whose
    estimate cannot be trusted to leave the dense part teach nothing (`_teaches`)."""
    eager: dict[int, list[float]] = defaultdict(list)
    replay: dict[int, list[float]] = defaultdict(list)
    for graph_set in sets:
        for row in graph_set.sizes:
            if row.kind != kind or not _teaches(unit, row):
                continue
            attention = _attention_ms(unit, row.kind, row.size, row)
            if kind == "extend" and pair_ms is not None:
                attention = pair_ms * float(attention_pairs(row.size, row.context))
            dense = max(row.measured_ms - attention, 0.0)
            (replay[row.graph_size] if row.graph_size else eager[row.size]).append(dense)
    return eager, replay


def _teaches(unit: Any, row: SizeTiming) -> bool:
    """Whether a row's dense part can be learned: decode rows always, extend rows only over
    short prefixes and when the roofline's attention is at most a part of their time."""
    if row.kind != "extend":
        return True
    attention = _attention_ms(unit, row.kind, row.size, row)
    return row.context <= MAX_PREFIX_PER_NEW_TOKEN * row.size and attention <= MAX_ATTENTION_SHARE * row.measured_ms


def _long_prefix_pair_ms(sets: list[SetResult], unit: Any) -> float | None:
    """ms per query-key pair at which the extend steps that taught nothing come out at their
    weighted measured mean, the dense part learned from the rest; None when every step taught."""
    long = [r for s in sets for r in s.sizes if r.kind == "extend" and not _teaches(unit, r)]
    if unit is None or not long:
        return None
    weight = np.array([r.weight for r in long])
    measured = np.array([r.measured_ms for r in long])
    pairs = np.array([float(attention_pairs(r.size, r.context)) for r in long])
    floor = MIN_PAIR_PRICE_SCALE * unit.attention_ms_per_pair
    pair_ms = unit.attention_ms_per_pair
    for _ in range(PAIR_PRICE_ROUNDS):
        points, _ = _dense_table(sets, "extend", unit, pair_ms)
        if not points:
            return None
        dense = _dense_at(points, long)
        pair_ms = max(float(weight @ (measured - dense)) / float(weight @ pairs), floor)
    return pair_ms


def _dense_at(points: list[tuple[int, float, float]], rows: list[SizeTiming]) -> np.ndarray:
    """Each row's dense ms as the profile fit will table it: its graph's replay, else its
    size's eager time."""
    sizes = np.array([p[0] for p in points])
    length = max([int(sizes[-1]), *(max(r.size, r.graph_size) for r in rows)]) + 1
    eager = size_table(sizes, np.array([p[1] for p in points]), length)
    replay = size_table(sizes, np.array([min(p[2], p[1]) for p in points]), length)
    return np.array([replay[r.graph_size] if r.graph_size else eager[r.size] for r in rows])


def _below_first(unit: Any, kind: str, points: list[tuple[int, float, float]]) -> list[tuple[int, float, float]]:
    """Points at 1, 2, 4, ... below the smallest size measured: the roofline's, scaled by how
    the measured size compared with it. The fit would otherwise hold the smallest size's time
    flat down to size 1, and a verify whose short steps all taught nothing (long prefixes) put
    a few new tokens at the cost of thousands."""
    first, e0, r0 = points[0]
    graph, eager = (unit.decode_graph_ms, unit.decode_eager_ms) if kind == "decode" else (
        unit.extend_graph_ms, unit.extend_eager_ms)
    e_scale, r_scale = e0 / max(eager[first], 1e-9), r0 / max(graph[first], 1e-9)
    below = [1 << i for i in range(int(first).bit_length()) if (1 << i) < first]
    return [(s, float(eager[s] * e_scale), float(graph[s] * r_scale)) for s in below]


def _eager_gap(unit: Any, kind: str) -> np.ndarray:
    """Per size, how much longer the roofline prices an eager step than a replayed one."""
    if kind == "decode":
        return unit.decode_eager_ms - unit.decode_graph_ms
    return unit.extend_eager_ms - unit.extend_graph_ms


def _attention_ms(unit: Any, kind: str, size: int, row: SizeTiming) -> float:
    """The planner's attention estimate for the steps' own context: no schedule changes it."""
    if unit is None:
        return 0.0
    if kind == "decode":
        return float(unit.kv_read_ms_per_token * size * row.context)
    return float(unit.attention_ms_per_pair * (size * row.context + size * (size + 1) / 2))
