"""PNG figures of a capture report, one set per graph kind (matplotlib, Agg, no pyplot)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from cgtool.documents.results import SIZE_UNITS, CaptureReport, SizeResult
from cgtool.units import MIB

EAGER_COLOUR, GRAPH_COLOUR, FAILED_COLOUR, MEMORY_COLOUR = "#d1495b", "#00798c", "#edae49", "#30638e"


def write_report_figures(report: CaptureReport, out_dir: Path) -> list[Path]:
    """Latency, speedup, memory and capture-time figures per kind; returns the PNG paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for kind in report.kinds():
        rows = sorted(report.sizes_of(kind), key=lambda r: r.size)
        subtitle = f"{report.model.name} on {report.environment.gpu_name}"
        for name, draw in _FIGURES.items():
            figure = Figure(figsize=(7.5, 4.2), dpi=110, layout="constrained")
            FigureCanvasAgg(figure)
            draw(figure.add_subplot(), rows, kind)
            figure.suptitle(subtitle, fontsize=9, color="#555555")
            path = out_dir / f"{kind}_{name}.png"
            figure.savefig(path)
            paths.append(path)
    return paths


def _x_label(kind: str) -> str:
    return SIZE_UNITS[kind]


def _values(rows: list[SizeResult], get: Callable[[SizeResult], float | None]) -> list[float]:
    return [math.nan if get(r) is None else float(get(r)) for r in rows]  # type: ignore[arg-type]


def _size_axis(ax: Axes, rows: list[SizeResult], kind: str) -> list[int]:
    sizes = [r.size for r in rows]
    ax.set_xscale("log", base=2)  # capture schedules are dense at small sizes, sparse at large
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.set_xlabel(_x_label(kind))
    ax.grid(True, which="major", alpha=0.3)
    failed = [r.size for r in rows if r.status != "ok"]
    for i, size in enumerate(failed):
        ax.axvline(size, color=FAILED_COLOUR, linestyle=":", linewidth=1.5,
                   label="failed / unsafe size" if i == 0 else None)
    return sizes


def _latency(ax: Axes, rows: list[SizeResult], kind: str) -> None:
    sizes = _size_axis(ax, rows, kind)
    ax.plot(sizes, _values(rows, lambda r: r.eager_ms), "o-", color=EAGER_COLOUR, ms=3, label="eager")
    ax.plot(sizes, _values(rows, lambda r: r.replay_ms), "o-", color=GRAPH_COLOUR, ms=3,
            label="CUDA graph replay")
    if any(r.roofline_ms for r in rows):
        ax.plot(sizes, _values(rows, lambda r: r.roofline_ms), "--", color="#888888",
                label="roofline")
    ax.set_ylabel("ms per forward")
    ax.set_title(f"{kind}: replay vs eager latency")
    ax.legend(fontsize=8)


def _speedup(ax: Axes, rows: list[SizeResult], kind: str) -> None:
    sizes = _size_axis(ax, rows, kind)
    ax.plot(sizes, _values(rows, lambda r: r.speedup), "o-", color=GRAPH_COLOUR, ms=3)
    ax.axhline(1.0, color="#888888", linewidth=1)
    ax.set_ylabel("speedup (eager / replay)")
    ax.set_title(f"{kind}: speedup from CUDA graphs")


def _memory(ax: Axes, rows: list[SizeResult], kind: str) -> None:
    sizes = _size_axis(ax, rows, kind)
    retained = [r.retained_bytes / MIB for r in rows]
    # Captured largest first, so the pool at size s holds every size >= s.
    cumulative = [sum(retained[i:]) for i in range(len(retained))]
    ax.vlines(sizes, 0, retained, color=MEMORY_COLOUR, linewidth=3, label="retained by this size")
    ax.set_ylabel("retained MiB per size")
    ax.set_ylim(bottom=min(0.0, *retained))
    twin = ax.twinx()
    twin.plot(sizes, cumulative, "-", color=EAGER_COLOUR,
              label="graph pool after capturing down to this size")
    twin.set_ylabel("cumulative MiB")
    twin.set_ylim(bottom=min(0.0, *cumulative))
    handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(handles=handles, fontsize=8, loc="center left")
    ax.set_title(f"{kind}: graph memory, captured largest first")


def _capture_time(ax: Axes, rows: list[SizeResult], kind: str) -> None:
    sizes = _size_axis(ax, rows, kind)
    # A failed size's capture time is how long it took to fail: not drawn as a capture.
    ax.plot(sizes, _values(rows, lambda r: None if r.status == "failed" else r.capture_s), "o-",
            color=MEMORY_COLOUR, ms=3)
    ax.set_ylabel("capture seconds")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{kind}: capture time per size (total {sum(r.capture_s for r in rows):.1f} s)")


_FIGURES: dict[str, Callable[[Axes, list[SizeResult], str], None]] = {
    "latency": _latency,
    "speedup": _speedup,
    "memory": _memory,
    "capture_time": _capture_time,
}
