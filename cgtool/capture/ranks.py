"""Tensor-parallel ranks: every rank's rows gathered on rank 0, and how far apart they are.

Ranks capture the same graphs over different shards; memory should match to the byte and
times to noise. A spread beyond that names the rank to look at (a GPU with less free
memory, a slower link, another process on it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from cgtool.capture.options import SessionState
from cgtool.documents.results import CaptureReport, CaptureTotals

SPREAD_FIELDS = ("retained_bytes", "peak_bytes", "non_torch_bytes", "capture_s", "replay_ms")


@dataclass(frozen=True, slots=True)
class RankSpread:
    kind: str
    size: int
    spread: dict[str, float]  # per field of SPREAD_FIELDS: max - min over the ranks
    highest_rank: dict[str, int]  # per field: the rank with the largest value
    ranks: int  # ranks with a measured row at this size


def rank_spread(report: CaptureReport) -> list[RankSpread]:
    """One row per (kind, size) measured on every rank, in capture order; [] at TP=1."""
    if report.settings.tp_size == 1:
        return []
    rows: list[RankSpread] = []
    for kind in report.kinds():
        for head in report.sizes_of(kind):
            same = [s for s in report.sizes if (s.kind, s.size) == (kind, head.size)
                    and s.status != "failed"]
            if len(same) < 2:
                continue
            spread, highest = {}, {}
            for name in SPREAD_FIELDS:
                values = [(float(getattr(s, name) or 0.0), s.rank) for s in same]
                spread[name] = max(values)[0] - min(values)[0]
                highest[name] = max(values)[1]
            rows.append(RankSpread(kind, head.size, spread, highest, len(same)))
    return rows


def gather_ranks(state: SessionState, totals: CaptureTotals) -> None:
    """Every rank's size rows (marked with their rank) and totals, on rank 0's `state`."""
    from cgtool.runtime.distributed import current_tp, gather_to_rank0

    rank = current_tp().rank
    rows = [dataclasses.replace(row, rank=rank) for row in state.sizes]
    gathered = gather_to_rank0((rows, totals))
    if gathered is None:
        return
    state.sizes = [row for rank_rows, _ in gathered for row in rank_rows]
    state.rank_totals = [rank_totals for _, rank_totals in gathered]
