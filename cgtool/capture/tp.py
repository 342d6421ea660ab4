"""`capture --tp N`: one capture session per rank, each on its own GPU, one report from rank 0.

Every rank runs the same `run_capture` (same sizes, same order, a barrier before each
capture), so the collectives inside its forwards and graphs line up; at the end rank 0
gathers every rank's rows and totals into the report.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from cgtool.capture.options import CaptureOptions, ProgressCallback, SessionState
from cgtool.capture.session import partial_report, resolve_model, run_capture
from cgtool.documents.results import CaptureReport


def run_capture_tp(opts: CaptureOptions, on_progress: ProgressCallback) -> CaptureReport:
    """Start `opts.tp_size` ranks, relay rank 0's progress, return the report rank 0 built.

    Any rank's failure stops every rank and is raised here as that rank's CgtoolError.
    """
    from cgtool.capture.launch import run_ranks

    resolve_model(opts.model, opts.random_weights)  # a bad --model fails here, not N times
    data = run_ranks(_capture_rank, opts.tp_size, (opts,), on_progress, log_dir=opts.out_dir)
    return CaptureReport.from_dict(data, "rank 0's report")


def rank_options(opts: CaptureOptions, rank: int) -> CaptureOptions:
    """Every rank profiles as rank 0 does: decode graphs hold NCCL collectives, so a replay
    that one rank ran alone (a profiled size) would wait for its peers forever. The other
    ranks' artifacts (traces, memory snapshots) go to a folder of their own."""
    return opts if rank == 0 else dataclasses.replace(opts, out_dir=opts.out_dir / f"rank{rank}")


def _capture_rank(rank: int, size: int, init_method: str, channel: Any, opts: CaptureOptions) -> None:
    import torch

    from cgtool.runtime.distributed import init_tensor_parallel

    init_tensor_parallel(rank, size, init_method, torch.device("cuda", rank))
    mine = rank_options(opts, rank)
    state = SessionState()
    try:
        report = run_capture(mine, channel.progress, state)
    except KeyboardInterrupt:
        # Stopped by the coordinator: no collective can be trusted now, so each rank sends
        # its own rows and the coordinator puts them together (merge_rank_partials).
        partial = partial_report(mine, state, "interrupted")
        if partial is not None:
            channel.partial(partial.to_dict())
        raise
    if rank == 0:
        channel.result(report.to_dict())


def merge_rank_partials(partials: dict[int, Any], tp_size: int, reason: str) -> CaptureReport | None:
    """One incomplete report from the partial reports the ranks sent when interrupted:
    every rank's rows stamped with its rank, and rank totals for the ranks that answered."""
    reports = {rank: CaptureReport.from_dict(data, f"rank {rank}'s partial report")
               for rank, data in sorted(partials.items())}
    if not reports:
        return None
    missing = [rank for rank in range(tp_size) if rank not in reports]
    if missing:
        reason += f"; rank {', '.join(map(str, missing))} sent nothing (see its rank log)"
    base = reports[min(reports)]
    return dataclasses.replace(
        base,
        sizes=[dataclasses.replace(row, rank=rank) for rank, r in reports.items() for row in r.sizes],
        # Totals of every rank or none: a report's rank_totals cover all ranks.
        rank_totals=[] if missing else [r.totals for r in reports.values()],
        status="incomplete",
        incomplete_reason=reason,
    )
