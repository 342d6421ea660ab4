"""PNG figures of a plan: where the steps fall, where the graphs sit, where memory goes."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from cgtool.documents.plan_document import Plan, StepHistogram
from cgtool.reports.plan_tables import gpus_label
from cgtool.units import GIB


def histogram_figure(
    hist: StepHistogram, sizes: list[int], default_sizes: list[int], title: str, unit: str
) -> Figure:
    """The simulated steps at each size, the plan's sizes and the default's drawn in."""
    fig, ax = plt.subplots(figsize=(10, 4))
    wide = max(hist.sizes, default=1) > 256
    if wide:
        ax.set_xscale("log", base=2)  # token counts span 1..chunk: equal room per doubling
        ax.scatter(hist.sizes, hist.counts, s=6, color="#4c72b0", label="steps (simulated)")
    else:
        ax.bar(hist.sizes, hist.counts, width=1.0, color="#4c72b0", label="steps (simulated)")
    for i, size in enumerate(sizes):
        ax.axvline(size, color="#dd8452", lw=0.8, alpha=0.9, label="plan" if i == 0 else None)
    for i, size in enumerate(s for s in default_sizes if s <= max(hist.sizes, default=0) * 1.2):
        ax.axvline(
            size, color="#55a868", lw=0.6, ls=":", label="engine default" if i == 0 else None
        )
    ax.set_xlabel(unit)
    ax.set_ylabel("steps")
    ax.set_title(title)
    if hist.counts:
        ax.set_yscale("log")
    # Outside the axes: inside, it sat on the largest bar (Mooncake's 8192-token steps).
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _memory_figure(plan: Plan, path: Path) -> Path:
    memory = plan.memory
    parts = [
        ("weights", memory.weights_bytes, "#4c72b0"),
        ("KV cache", memory.kv_bytes, "#55a868"),
        ("graphs", memory.graph_bytes, "#dd8452"),
        ("activations", memory.activation_bytes, "#c44e52"),
        ("margin", memory.margin_bytes, "#8172b3"),
    ]
    used = sum(value for _, value, _ in parts)
    parts.append(("unassigned", max(memory.gpu_memory_bytes - used, 0), "#cccccc"))
    fig, ax = plt.subplots(figsize=(9, 2.2))
    left = 0.0
    for label, value, color in parts:
        ax.barh(0, value / GIB, left=left, color=color, label=f"{label} {value / GIB:.1f} GiB")
        left += value / GIB
    static = memory.mem_fraction_static * memory.gpu_memory_bytes / GIB
    ax.axvline(
        static,
        color="black",
        lw=1,
        ls="--",
        label=f"mem-fraction-static {memory.mem_fraction_static:.3f}",
    )
    ax.set_xlim(0, memory.gpu_memory_bytes / GIB)
    ax.set_yticks([])
    ax.set_title(f"Memory {'per GPU of' if plan.inputs.tp_size > 1 else 'on'} {gpus_label(plan)} (GiB)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=4, fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def write_plan_figures(plan: Plan, out_dir: Path) -> list[Path]:
    """Decode and extend size histograms with the chosen sizes drawn in, and a memory bar."""
    out_dir = Path(out_dir)
    d, p = plan.decode, plan.piecewise
    decode = histogram_figure(d.histogram, d.capture_bs, d.default_capture_bs,
                              "Decode batch sizes", "requests in a decode step")
    extend = histogram_figure(p.histogram, p.capture_num_tokens, p.default_capture_num_tokens,
                              "Extend token counts", "tokens in an extend step")
    return [
        _save(decode, out_dir / "plan_decode.png"),
        _save(extend, out_dir / "plan_extend.png"),
        _memory_figure(plan, out_dir / "plan_memory.png"),
    ]
