"""Memory invariants every capture report must satisfy, decided here and nowhere else.

1. Per size: `peak_bytes >= retained_bytes >= 0`. Both are measured over the same capture
   window, and every byte the pool gained was newly reserved during it.
2. Per rank of a complete report: the sizes' `retained_bytes` add up to that rank's
   `graph_pool_bytes`, within POOL_TOLERANCE_BYTES. Graphs allocate only while capturing, so
   a larger gap is pool memory gained outside every size's measured window.
3. Per rank of a complete report: `free_before_capture_bytes - free_after_capture_bytes`
   equals `graph_pool_bytes + non_torch_bytes + static_buffer_bytes + other_torch_bytes`
   (the runners' static inputs and outputs, and what else torch kept outside the pool, such
   as the capture stream's cuBLAS workspace), within the larger of FREE_TOLERANCE_BYTES and
   FREE_TOLERANCE_FRACTION of that sum. The drop in free memory is what torch reserved plus
   what it does not see; the gap is the allocator's cache outside the pool changing between
   the two readings, which a measurement taken in the same cache state keeps small.

An incomplete report's totals are those at the start of the run (nothing after the failure
was read), so rules 2 and 3 apply to complete reports only.
"""

from __future__ import annotations

from dataclasses import dataclass

from cgtool.documents.compare import size_label
from cgtool.documents.results import CaptureReport, CaptureTotals, SizeResult
from cgtool.errors import InputError
from cgtool.units import MIB

POOL_TOLERANCE_BYTES = 2 * MIB  # one segment of the caching allocator's large-block pool
FREE_TOLERANCE_BYTES = 64 * MIB
FREE_TOLERANCE_FRACTION = 0.05


@dataclass(frozen=True, slots=True)
class Violation:
    rule: str  # which of the three, in words: "peak >= retained >= 0", ...
    where: str  # "piecewise 4096 tokens", "total", "total rank 1"
    detail: str

    def __str__(self) -> str:
        return f"{self.where}: {self.rule} fails ({self.detail})"


def memory_violations(report: CaptureReport) -> list[Violation]:
    """Every broken memory invariant of `report`, sizes first; empty when all hold."""
    found = [v for row in report.sizes for v in _size_violations(row)]
    if report.status != "complete":
        return found
    for rank, totals in _totals_by_rank(report):
        retained = sum(s.retained_bytes for s in report.sizes if s.rank == rank)
        where = "total" if rank == 0 else f"total rank {rank}"
        found += _pool_violations(where, retained, totals) + _free_violations(where, totals)
    return found


def require_memory_invariants(report: CaptureReport, source: str) -> None:
    """Raise one InputError naming `source` and the first broken invariant."""
    broken = memory_violations(report)
    if broken:
        more = f" and {len(broken) - 1} more" if len(broken) > 1 else ""
        raise InputError(f"{source}: memory figures contradict each other: {broken[0]}{more}",
                         "Re-measure it with a cgtool whose capture passes these checks "
                         "(docs/formats.md, 'Memory invariants').")


def free_tolerance_bytes(expected_bytes: int) -> float:
    return max(FREE_TOLERANCE_BYTES, FREE_TOLERANCE_FRACTION * abs(expected_bytes))


def _size_violations(row: SizeResult) -> list[Violation]:
    if row.peak_bytes >= row.retained_bytes >= 0:
        return []
    return [Violation("peak >= retained >= 0", size_label(*row.key),
                      f"peak {_mib(row.peak_bytes)}, retained {_mib(row.retained_bytes)}")]


def _pool_violations(where: str, retained: int, totals: CaptureTotals) -> list[Violation]:
    if abs(retained - totals.graph_pool_bytes) <= POOL_TOLERANCE_BYTES:
        return []
    return [Violation("sum of retained = graph pool", where,
                      f"sizes retain {_mib(retained)}, pool grew {_mib(totals.graph_pool_bytes)}, "
                      f"tolerance {_mib(POOL_TOLERANCE_BYTES)}")]


def _free_violations(where: str, totals: CaptureTotals) -> list[Violation]:
    drop = totals.free_before_capture_bytes - totals.free_after_capture_bytes
    expected = (totals.graph_pool_bytes + totals.non_torch_bytes + totals.static_buffer_bytes
                + totals.other_torch_bytes)
    tolerance = free_tolerance_bytes(expected)
    if abs(drop - expected) <= tolerance:
        return []
    return [Violation("free drop = pool + non-torch + static buffers + other torch", where,
                      f"free fell {_mib(drop)}, its parts add up to {_mib(expected)}, "
                      f"tolerance {_mib(tolerance)}")]


def _totals_by_rank(report: CaptureReport) -> list[tuple[int, CaptureTotals]]:
    return list(enumerate(report.rank_totals)) or [(0, report.totals)]


def _mib(num_bytes: float) -> str:
    return f"{num_bytes / MIB:,.0f} MiB"
