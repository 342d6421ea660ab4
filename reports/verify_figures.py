"""Verify's figures: measured against predicted step time by size, one per graph kind."""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from cgtool.verify.result import VerifyResult

_COLOUR = {"plan": "#00798c", "default": "#d1495b"}


def write_verify_figures(result: VerifyResult, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for kind in ("decode", "extend"):
        if not any(r.kind == kind for s in result.sets for r in s.sizes):
            continue
        figure = Figure(figsize=(7.5, 4.2), dpi=110, layout="constrained")
        FigureCanvasAgg(figure)
        ax = figure.add_subplot()
        for s in result.sets:
            rows = [r for r in s.sizes if r.kind == kind]
            sizes = [r.size for r in rows]
            ax.plot(sizes, [r.measured_ms for r in rows], "o", ms=3, color=_COLOUR[s.name],
                    label=f"{s.name} measured")
            ax.plot(sizes, [r.predicted_ms for r in rows], "-", lw=1, color=_COLOUR[s.name],
                    alpha=0.7, label=f"{s.name} predicted")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size" if kind == "decode" else "new tokens")
        ax.set_ylabel("step time (ms)")
        ax.set_title(f"{kind} steps: measured vs predicted")
        ax.legend(fontsize=8)
        figure.suptitle(f"{result.model.name} on {result.environment.gpu_name}", fontsize=9,
                        color="#555555")
        path = out_dir / f"verify_{kind}_step_ms.png"
        figure.savefig(path)
        paths.append(path)
    return paths
