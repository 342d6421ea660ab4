"""Verify's HTML: a section (for pages that embed it) and a self-contained page."""

from __future__ import annotations

from pathlib import Path

from cgtool.reports.html import _cards, _e, _figures, _page, table_html
from cgtool.reports.tables import mib
from cgtool.reports.verify_figures import write_verify_figures
from cgtool.reports.verify_view import verdict_line, verify_tables
from cgtool.verify.result import VerifyResult

VERIFY_HTML = "verify.html"


def verify_section(result: VerifyResult, figures: list[Path]) -> str:
    cards = [(f"{result.settings.mem_fraction_static:g}", "mem-fraction-static"),
             (result.rehearsal.status, "memory rehearsal"),
             (mib(result.rehearsal.headroom_bytes), "headroom")]
    if result.ratio is not None:
        cards.insert(0, (f"{result.ratio.mean:.3f}", "plan / default step time"))
    parts = ["<h2>Verification on the GPU</h2>", f"<div class='banner'>{_e(verdict_line(result))}</div>",
             _cards(cards)]
    parts += [f"<div class='banner'>{_e(w)}</div>" for w in result.warnings]
    parts.append(_figures(figures) if figures else "")
    parts += [table_html(t) for t in verify_tables(result)]
    return "\n".join(parts)


def render_verify(result: VerifyResult, out_dir: Path) -> list[Path]:
    """figures/verify_*.png and verify.html."""
    figures = write_verify_figures(result, out_dir / "figures")
    title = f"{result.model.name} on {result.environment.gpu_name}"
    body = f"<h1>cgtool verify: {_e(title)}</h1>" + verify_section(result, figures)
    path = out_dir / VERIFY_HTML
    path.write_text(_page(f"cgtool verify: {title}", body), encoding="utf-8")
    return [*figures, path]
