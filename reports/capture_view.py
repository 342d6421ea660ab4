"""The capture command's terminal output: a progress bar like SGLang's, then the tables."""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Self

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cgtool.capture.options import CaptureFailure, CaptureProgress
from cgtool.documents.results import CaptureReport
from cgtool.planner.cost import SERVER_GRAPH_GAP_MS, lone_decode_gap_ms
from cgtool.reports.render import printed_tables
from cgtool.reports.tables import to_rich
from cgtool.units import GIB, MIB


class CaptureProgressBar:
    """One bar per phase; the text names the size being captured and the free GPU memory."""

    def __init__(self, console: Console) -> None:
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=console, transient=False,
        )
        self.tasks: dict[tuple[str, str], int] = {}
        self.start = time.perf_counter()

    def _line(self, text: str) -> None:
        """A phase line, stamped with the seconds since the session began."""
        elapsed = time.perf_counter() - self.start
        self.progress.console.print(f"[{elapsed:6.1f} s] {text}", highlight=False)

    def __enter__(self) -> Self:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(None, None, None)

    def update(self, event: CaptureProgress) -> None:
        free = f"avail mem {event.free_bytes / GIB:.2f} GiB"
        if event.phase in ("load", "compile", "profile"):
            what = {"load": "loading model and KV pool", "compile": f"compiling {event.kind} pieces",
                    "profile": f"counting {event.kind} kernels"}[event.phase]
            self._line(f"{what} ({free})")
            return
        key = (event.kind, event.phase)
        label = {"decode": "bs", "piecewise": "tokens"}.get(event.kind, "patches")
        description = f"{event.phase} {event.kind} {label}={event.size} ({free})"
        if key not in self.tasks:
            self.tasks[key] = self.progress.add_task(description, total=event.total)
            if not self.progress.console.is_terminal:  # a log file gets one line per phase
                self._line(f"{event.phase} {event.kind}: {event.total} sizes ({free})")
        self.progress.update(self.tasks[key], description=description, completed=event.done + 1)


def remedies(report: CaptureReport, failed: CaptureFailure | None) -> list[str]:
    """SGLang's order: lower the largest size, then the memory fraction, then drop token bins."""
    if failed is None:
        return []
    fitted = [s.size for s in report.sizes if s.kind == failed.kind and s.status != "failed"]
    flag = "--cuda-graph-max-bs" if failed.kind == "decode" else "--piecewise-cuda-graph-max-tokens"
    lines = []
    if failed.kind == "vit":  # no server flag bounds ViT graphs: each image size is one graph
        return [f"drop the image sizes of {failed.size} patches and more from --image-sizes"]
    if fitted:
        lines.append(f"lower {flag} to {max(fitted)}, the largest size that fitted")
    else:
        lines.append(f"lower {flag} below {failed.size}")
    fraction = report.settings.mem_fraction_static
    if failed.shortfall_bytes and failed.total_bytes:
        step = math.ceil(failed.shortfall_bytes / failed.total_bytes * 1000) / 1000
        lines.append(
            f"or lower --mem-fraction-static by at least {step:.3f} (to {fraction - step:.3f}): "
            f"the failed allocation needed {failed.shortfall_bytes / MIB:,.0f} MiB more"
        )
    else:
        lines.append(f"or lower --mem-fraction-static below {fraction} to leave the graphs more room")
    if failed.kind == "piecewise":
        lines.append("or drop the largest token bins (--tokens)")
    return lines


def lone_decode_note(report: CaptureReport) -> str | None:
    """Decode graphs captured alone replay faster than a server's, which also hold prefill
    graphs: say by how much, on the report's own kernel count."""
    counts = [s.kernels_per_forward for s in report.sizes_of("decode") if s.status != "failed"]
    if not counts:
        return None
    kernels = statistics.median(counts)
    gap_ms = lone_decode_gap_ms(report.settings.kinds, kernels)
    if not gap_ms:
        return None
    return (f"decode replays were timed with no prefill graph in the process; where prefill graphs "
            f"were captured too, as in a server, each kernel started about {SERVER_GRAPH_GAP_MS * 1e3:.2f} "
            f"us later (H200, 2026-11-28): about {gap_ms:.2f} ms a step here ({kernels:.0f} kernels). "
            f"`--kind both` times that state, and `plan --profile` adds it")


def redone_note(report: CaptureReport) -> str | None:
    """MLA decode sizes whose replay did chunks of stage 1 twice (scores outside its fixed
    maximum's range, which random weights never leave): what each cost and the switch."""
    redone = [s for s in report.sizes_of("decode") if s.mla_chunks_redone]
    if not redone:
        return None
    worst = max(redone, key=lambda s: s.mla_chunks_redone or 0)
    return (f"MLA decode did chunks twice at {len(redone)} batch size(s) (bs {worst.size}: "
            f"{worst.mla_chunks_redone:,} in one replay): their scores left stage 1's fixed maximum's "
            f"range, and each such chunk costs about a second pass over its keys. The results are "
            f"right; to time these weights without it, run again with CGTOOL_MLA_FIXED_MAX=0")


def print_capture_summary(
    console: Console,
    report: CaptureReport,
    failed: CaptureFailure | None,
    written: list[Path],
) -> None:
    for table in printed_tables(report):  # the tables `cgtool report` prints again
        console.print(to_rich(table))
    unsafe = [s for s in report.sizes if s.status == "unsafe"]
    for row in unsafe:
        on_rank = f" on rank {row.rank}" if report.settings.tp_size > 1 else ""
        console.print(
            f"[bold red]unsafe:[/] {row.kind} size {row.size}{on_rank}: replay differs from eager by "
            f"{row.max_abs_diff:.3g}", highlight=False,
        )
    for note in (lone_decode_note(report), redone_note(report)):
        if note:
            console.print(f"[bold]note:[/] {note}", highlight=False)
    if report.incomplete_reason:
        console.print(f"[bold red]incomplete:[/] {report.incomplete_reason}", highlight=False)
        for line in remedies(report, failed):
            console.print(f"  - {line}", highlight=False)
    for path in written:
        console.print(f"wrote {path}", highlight=False)
