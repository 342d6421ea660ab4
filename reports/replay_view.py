"""`cgtool replay`'s tables, figures and HTML page: measured against predicted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from rich.console import Console

from cgtool.replay.result import ReplayResult
from cgtool.reports.html import _cards, _e, _figures, _page, table_html
from cgtool.reports.tables import TableData, to_rich

REPLAY_HTML = "replay.html"
_MEASURED, _PREDICTED = "#00798c", "#d1495b"


def _number(value: float, unit: str) -> str:
    if unit == "tok/s":
        return f"{value:,.1f}"
    return f"{value:,.3f}" if unit == "ms" and value < 100 else f"{value:,.1f}" if unit else f"{value:.3f}"


def metric_rows(result: ReplayResult) -> TableData:
    rows = []
    for m in result.metrics:
        error = f"{m.error:.3f}" if not m.unit else f"{100 * m.error:+.1f}%"
        predicted = "-" if not m.unit else _number(m.predicted, m.unit)
        rows.append([m.name, m.unit or "TVD", _number(m.measured, m.unit), predicted, error, Path(m.source).name])
    s = result.settings
    title = (f"Measured vs predicted: {s.requests} requests at load {s.load:g}, {s.schedule} schedule "
             f"({len(s.capture_bs)} decode, {len(s.capture_num_tokens)} piecewise graphs)")
    return TableData(title, ["figure", "unit", "measured", "predicted", "error", "prediction"], rows)


def step_rows(result: ReplayResult) -> TableData:
    kind = np.array(result.steps.kind)
    padded = np.array(result.steps.padded, dtype=np.int64)
    time_ms = np.array(result.steps.time_ms, dtype=np.float64)
    rows = []
    for k in ("decode", "extend"):
        for graph, label in ((True, "graph"), (False, "eager")):
            pick = (kind == k) & ((padded > 0) == graph)
            if pick.any():
                rows.append([k, label, f"{int(pick.sum()):,}", f"{time_ms[pick].mean():.3f}",
                             f"{np.median(time_ms[pick]):.3f}", f"{time_ms[pick].sum() / 1e3:.2f}"])
    return TableData("Steps run", ["kind", "ran as", "steps", "mean ms", "median ms", "total s"], rows)


def replay_tables(result: ReplayResult) -> list[TableData]:
    return [metric_rows(result), step_rows(result)] if result.metrics else [step_rows(result)]


def headline(result: ReplayResult) -> str:
    s, env = result.settings, result.environment
    line = (f"{result.model.name} on {env.gpu_name}: {s.requests} requests of {Path(s.trace).name}, "
            f"{len(result.steps):,} steps, status {result.status}")
    return line + (f" ({result.reason})" if result.reason else "")


def print_replay(console: Console, result: ReplayResult) -> None:
    console.print(headline(result), highlight=False, soft_wrap=True)
    for table in replay_tables(result):
        console.print(to_rich(table))
    for p in result.predictions:
        if not p.policy_agrees:
            console.print(f"note: the step-by-step policy and the simulator disagreed on {p.source}'s "
                          "decode histogram", highlight=False)
    for w in result.warnings:
        console.print(f"warning: {w}", highlight=False, soft_wrap=True)


def write_replay_figures(result: ReplayResult, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    if result.measured is not None and result.predictions:
        paths.append(_save(_histogram_figure(result), out_dir / "replay_decode_batch.png"))
    if len(result.steps):
        paths.append(_save(_timeline_figure(result), out_dir / "replay_steps.png"))
    return paths


def _figure(result: ReplayResult) -> Figure:
    figure = Figure(figsize=(7.5, 4.2), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    figure.suptitle(headline(result), fontsize=8, color="#555555")
    return figure


def _histogram_figure(result: ReplayResult) -> Figure:
    figure = _figure(result)
    ax = figure.add_subplot()
    measured, predicted = result.measured, result.predictions[0].summary
    assert measured is not None
    for summary, colour, label, offset in ((measured, _MEASURED, "measured", -0.2),
                                           (predicted, _PREDICTED, f"predicted ({Path(result.predictions[0].source).name})", 0.2)):
        counts = np.array(summary.decode_counts, dtype=np.float64)
        share = counts / counts.sum() if counts.sum() else counts
        ax.bar(np.array(summary.decode_sizes) + offset, share, width=0.4, color=colour, label=label)
    ax.set_xlabel("decode batch size")
    ax.set_ylabel("share of decode steps")
    ax.legend(fontsize=8)
    return figure


def _timeline_figure(result: ReplayResult) -> Figure:
    figure = _figure(result)
    ax = figure.add_subplot()
    kind = np.array(result.steps.kind)
    start = np.array(result.steps.start_ms) / 1e3
    size = np.array(result.steps.size)
    decode = kind == "decode"
    ax.plot(start[decode], size[decode], ".", ms=1.5, color=_MEASURED, label="decode batch size")
    ax.set_xlabel("time since the first arrival (s)")
    ax.set_ylabel("decode batch size")
    if (~decode).any():
        twin = ax.twinx()
        twin.plot(start[~decode], size[~decode], "x", ms=3, color=_PREDICTED, label="extend tokens")
        twin.set_ylabel("extend tokens")
    ax.legend(fontsize=8, loc="upper left")
    return figure


def _save(figure: Figure, path: Path) -> Path:
    figure.savefig(path)
    return path


def render_replay(result: ReplayResult, out_dir: Path) -> list[Path]:
    """figures/replay_*.png and replay.html."""
    figures = write_replay_figures(result, out_dir / "figures")
    cards = [(f"{len(result.steps):,}", "steps"), (result.status, "status")]
    if result.measured is not None:
        cards.insert(0, (f"{result.measured.throughput_tok_s:,.0f}", "output tok/s"))
    parts = [f"<h1>cgtool replay: {_e(headline(result))}</h1>", _cards(cards)]
    parts += [f"<div class='banner'>{_e(w)}</div>" for w in result.warnings]
    parts.append(_figures(figures) if figures else "")
    parts += [table_html(t) for t in replay_tables(result)]
    path = out_dir / REPLAY_HTML
    path.write_text(_page(f"cgtool replay: {result.model.name}", "\n".join(parts)), encoding="utf-8")
    return [*figures, path]
