"""What a capture schedule costs on a set of steps: padding, coverage, expected step time."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cgtool.documents.plan_document import ScheduleScore
from cgtool.planner.cost import CostModel
from cgtool.planner.step_time import StepCost


def padded_sizes(
    sizes: np.ndarray, captured: list[int] | tuple[int, ...], pads: bool = True
) -> np.ndarray:
    """The graph size each step replays, 0 where it runs eagerly."""
    if not len(captured):
        return np.zeros(len(sizes), dtype=np.int64)
    graphs = np.array(sorted(captured), dtype=np.int64)
    index = np.searchsorted(graphs, sizes, side="left")
    padded = np.where(index < len(graphs), graphs[np.minimum(index, len(graphs) - 1)], 0)
    if not pads:
        padded = np.where(padded == sizes, padded, 0)
    return padded


def dense_ms(
    sizes: np.ndarray,
    counts: np.ndarray,
    graph_ms: np.ndarray,
    eager_ms: np.ndarray,
    captured: list[int] | tuple[int, ...],
    pads: bool = True,
) -> float:
    """Summed dense ms of the observed steps under a capture list."""
    padded = padded_sizes(sizes, captured, pads)
    per_step = np.where(padded > 0, graph_ms[padded], eager_ms[sizes])
    return float((counts * per_step).sum())


@dataclass(frozen=True, eq=False)
class Histogram:
    """Steps of one kind: how often each size ran, for how long, and its attention time
    (context reads for decode, query-key work for extend), which no schedule changes."""

    sizes: np.ndarray  # [k] ascending
    counts: np.ndarray  # [k]
    time_s: np.ndarray  # [k] time spent at each size in the simulation
    attention_ms: np.ndarray  # [k] summed over those steps

    def to_dict(self) -> dict[str, list]:
        return {
            "sizes": self.sizes.tolist(),
            "counts": self.counts.tolist(),
            "time_s": self.time_s.tolist(),
        }


def _kind_totals(
    hist: Histogram, graph_ms: np.ndarray, eager_ms: np.ndarray, captured, pads
) -> tuple[float, float, float, float]:
    """(dense + attention ms, steps on a graph, padding units, computed units)."""
    padded = padded_sizes(hist.sizes, captured, pads)
    on_graph = padded > 0
    total_ms = dense_ms(hist.sizes, hist.counts, graph_ms, eager_ms, captured, pads) + float(
        hist.attention_ms.sum()
    )
    computed = np.where(on_graph, padded, hist.sizes)
    padding = float((hist.counts * (computed - hist.sizes)).sum())
    return (
        total_ms,
        float(hist.counts[on_graph].sum()),
        padding,
        float((hist.counts * computed).sum()),
    )


def score_schedule(
    name: str,
    decode: Histogram,
    extend: Histogram,
    cost: CostModel,
    decode_bs: list[int] | tuple[int, ...],
    tokens: list[int] | tuple[int, ...],
    *,
    pads: bool = True,
    kv_tokens: int = 0,
) -> ScheduleScore:
    """Expected step time, coverage and cost of a capture schedule on the given steps."""
    d_ms, d_graph, d_pad, d_rows = _kind_totals(
        decode, cost.decode_graph_ms, cost.decode_eager_ms, decode_bs, pads
    )
    e_ms, e_graph, e_pad, e_rows = _kind_totals(
        extend, cost.extend_graph_ms, cost.extend_eager_ms, tokens, pads
    )
    d_steps, e_steps = float(decode.counts.sum()), float(extend.counts.sum())
    # A padded replay all-reduces its padding rows too.
    d_comm, e_comm = cost.decode_comm_ms, cost.extend_comm_ms
    comm = dense_ms(decode.sizes, decode.counts, d_comm, d_comm, decode_bs, pads) + dense_ms(
        extend.sizes, extend.counts, e_comm, e_comm, tokens, pads
    )
    return ScheduleScore(
        schedule=name,
        expected_step_ms=(d_ms + e_ms) / max(d_steps + e_steps, 1.0),
        decode_coverage=d_graph / d_steps if d_steps else 0.0,
        extend_coverage=e_graph / e_steps if e_steps else 0.0,
        padding_waste=(d_pad + e_pad) / max(d_rows + e_rows, 1.0),
        num_graphs=len(decode_bs) + len(tokens),
        graph_bytes=cost.graph_bytes(list(decode_bs), list(tokens)),
        capture_s=cost.capture_s(list(decode_bs), list(tokens)),
        kv_tokens=kv_tokens,
        comm_ms=comm / max(d_steps + e_steps, 1.0),
    )


def served_ms(
    graph_ms: np.ndarray, eager_ms: np.ndarray, captured: tuple[int, ...], pads: bool
) -> np.ndarray:
    """Dense ms of every size under a capture list (index = size)."""
    sizes = np.arange(len(graph_ms))
    padded = padded_sizes(sizes, captured, pads)
    return np.where(padded > 0, graph_ms[np.minimum(padded, len(graph_ms) - 1)], eager_ms)


def schedule_step_cost(
    cost: CostModel, decode_bs: list[int] | tuple[int, ...], tokens: list[int] | tuple[int, ...],
    pads: bool = True,
) -> StepCost:
    """Step times of a server that runs this capture schedule, under this cost model."""
    return StepCost(
        decode_ms=served_ms(cost.decode_graph_ms, cost.decode_eager_ms, tuple(decode_bs), pads),
        extend_ms=served_ms(cost.extend_graph_ms, cost.extend_eager_ms, tuple(tokens), pads),
        kv_read_ms_per_token=cost.kv_read_ms_per_token,
        attention_ms_per_pair=cost.attention_ms_per_pair,
    )
