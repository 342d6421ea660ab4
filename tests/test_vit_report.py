"""A ViT capture's report: its rows round-trip through report.json and render like other kinds."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

from rich.console import Console

from cgtool.capture.options import CaptureFailure
from cgtool.documents.results import REPORT_VERSION, load_report, write_report
from cgtool.reports.capture_view import print_capture_summary, remedies
from cgtool.reports.render import render_report
from cgtool.reports.tables import size_rows

FIXTURE = Path(__file__).parent / "data" / "reports" / "h100-llama-3.1-8b"


def _vit_report():
    # The decode rows of a real report relabelled as ViT rows: the figures are placeholders,
    # only the kind, sizes and settings are what a ViT capture writes.
    report = load_report(FIXTURE)
    rows = [dataclasses.replace(r, kind="vit", size=p)
            for r, p in zip(report.sizes_of("decode")[:4], (9216, 4096, 2400, 1024), strict=True)]
    settings = dataclasses.replace(report.settings, kinds=["vit"], capture_bs=[], capture_num_tokens=[],
                                   image_sizes=[[1344, 1344], [896, 896], [560, 840], [448, 448]])
    totals = dataclasses.replace(report.totals, kv_pool_bytes=0, kv_tokens=0)  # no LM loaded
    return dataclasses.replace(report, sizes=rows, settings=settings, totals=totals)


def test_vit_rows_round_trip_through_report_json(tmp_path):
    report = _vit_report()
    write_report(report, tmp_path / "report.json")
    assert f'"version": "{REPORT_VERSION}"' in (tmp_path / "report.json").read_text()
    again = load_report(tmp_path)
    assert again.kinds() == ["vit"]
    assert [r.size for r in again.sizes_of("vit")] == [9216, 4096, 2400, 1024]
    assert again.settings.image_sizes == [[1344, 1344], [896, 896], [560, 840], [448, 448]]


def test_vit_rows_render_with_a_patches_column_and_their_figures(tmp_path):
    report = _vit_report()
    table = size_rows(report, "vit")
    assert table.columns[0] == "patches" and [row[0] for row in table.rows] == ["9216", "4096", "2400", "1024"]
    written = {p.name for p in render_report(report, tmp_path)}
    assert {"vit_latency.png", "vit_memory.png", "report.html", "sizes.csv"} <= written


def test_the_capture_summary_prints_the_vit_table_and_totals_without_a_kv_pool():
    report = _vit_report()
    console = Console(file=io.StringIO(), width=200)
    print_capture_summary(console, report, None, [])
    text = console.file.getvalue()
    assert "vit graphs" in text and "patches" in text and "0 tokens" in text


def test_a_vit_size_out_of_memory_names_the_image_sizes_as_remedy():
    report = _vit_report()
    failure = CaptureFailure("vit", 9216, free_bytes=1 << 30, shortfall_bytes=1 << 28, total_bytes=80 << 30)
    assert remedies(report, failure) == ["drop the image sizes of 9216 patches and more from --image-sizes"]
