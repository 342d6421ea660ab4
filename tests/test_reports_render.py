"""Rendering a report or plan: CSV, non-empty figures, one self-contained HTML page, tables."""

from __future__ import annotations

import copy
import io
import re
import sys
import types
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.image import imread
from rich.console import Console

from cgtool.documents.compare import compare_reports
from cgtool.documents.plan_document import StepHistogram
from cgtool.documents.results import load_plan, load_report
from cgtool.reports.csv import sizes_frame
from cgtool.reports.html import MEMORY_VIZ_URL, report_html
from cgtool.reports.markdown import comparison_markdown
from cgtool.reports.plan_figures import histogram_figure
from cgtool.reports.render import engine_files, render_path, render_report
from cgtool.reports.tables import size_rows, to_rich

FIXTURES = Path(__file__).parent / "data" / "reports"
REPORT_DIR = FIXTURES / "h100-llama-3.1-8b"
OOM_DIR = FIXTURES / "h100-llama-3.1-8b-oom"
PLAN_DIR = FIXTURES / "plan-llama-3.1-8b"
FIGURE_NAMES = {f"{kind}_{name}.png" for kind in ("decode", "piecewise")
                for name in ("latency", "speedup", "memory", "capture_time")}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    return render_path(REPORT_DIR, tmp_path_factory.mktemp("out"))


def _distinct_colours(png: Path) -> int:
    pixels = (imread(png)[..., :3] * 255).astype(np.uint8).reshape(-1, 3)
    return len(np.unique(pixels, axis=0))


def test_report_renders_csv_eight_figures_and_html(rendered):
    names = {p.name for p in rendered.files}
    assert names == FIGURE_NAMES | {"sizes.csv", "report.html"}
    assert all(p.is_file() and p.stat().st_size > 0 for p in rendered.files)


def test_every_figure_has_content(rendered):
    for png in (p for p in rendered.files if p.suffix == ".png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert _distinct_colours(png) > 50, png.name  # lines, text and legends, not a blank canvas


def test_html_is_self_contained_with_every_figure_inlined(rendered):
    page = next(p for p in rendered.files if p.name == "report.html").read_text()
    assert page.count("src='data:image/png;base64,") == 8
    assert not re.search(r"<(script|link|iframe)\b", page)  # nothing fetched from anywhere
    assert not re.search(r"src=['\"]https?:", page)
    assert "<td>256</td>" in page and "<td>4096</td>" in page
    assert "NVIDIA H100 80GB HBM3" in page and "550.54.15" in page


def test_html_links_the_memory_snapshot_to_pytorch_memory_viz(rendered):
    page = next(p for p in rendered.files if p.name == "report.html").read_text()
    assert f"href='{MEMORY_VIZ_URL}'" in page
    # Rendered into another folder, so the link leads back to the report's folder.
    assert re.search(r"href='[^']*h100-llama-3\.1-8b/memory_snapshot\.pickle'", page)


def test_sizes_csv_has_every_size_and_cumulative_memory(rendered):
    frame = pd.read_csv(next(p for p in rendered.files if p.name == "sizes.csv"))
    assert len(frame) == 42
    decode = frame[frame["kind"] == "decode"]
    assert decode["size"].tolist()[:2] == [256, 248]
    assert decode["cumulative_retained_bytes"].iloc[-1] == decode["retained_bytes"].sum()


def test_incomplete_report_shows_banner_and_marks_failed_size(tmp_path):
    result = render_path(OOM_DIR, tmp_path)
    page = (tmp_path / "report.html").read_text()
    assert "Incomplete run: out of memory capturing decode bs 256" in page
    assert "<tr class='marked'><td>256</td><td>failed</td>" in page
    assert {p.name for p in result.files} >= {"decode_latency.png", "sizes.csv"}
    frame = sizes_frame(result.document)
    assert np.isnan(frame.loc[frame["size"] == 256, "replay_ms"]).all()


def test_render_beside_the_report_by_default(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "report.json").write_text((REPORT_DIR / "report.json").read_text())
    result = render_path(folder / "report.json")
    assert (folder / "report.html").is_file() and (folder / "figures" / "decode_speedup.png").is_file()
    assert "href='memory_snapshot.pickle'" in (folder / "report.html").read_text()
    assert result.source == folder / "report.json"


def test_plan_figures_and_options_file_go_beside_the_plan(tmp_path):
    result = render_path(PLAN_DIR, tmp_path)
    names = [p.name for p in result.files]
    assert names == ["plan_decode.png", "plan_extend.png", "plan_memory.png", "plan.html"]
    assert all(p.parent == tmp_path for p in result.files)
    page = (tmp_path / "plan.html").read_text()
    assert "--mem-fraction-static 0.9423" in page
    assert "Plan against the engine&#x27;s default" in page


def test_engine_files_come_from_the_flag_line_that_names_them():
    plan = load_plan(PLAN_DIR)
    plan.flags["trtllm"] = ["--extra_llm_api_options opts.yaml",
                            "# opts.yaml: cuda_graph_config: {batch_sizes: [1, 2]}"]
    assert engine_files(plan) == {"opts.yaml": "cuda_graph_config: {batch_sizes: [1, 2]}\n"}
    plan.flags["trtllm"] = []
    assert engine_files(plan) == {}


def test_extend_legend_sits_outside_the_axes():
    # Mooncake's largest bar is at the right edge, where the legend used to sit.
    hist = StepHistogram([512, 2048, 8192], [10, 100, 8895], [1.0, 1.0, 1.0])
    fig = histogram_figure(hist, [512, 8192], [512, 8192], "t", "x")
    fig.canvas.draw()
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent()
    assert legend.x0 >= ax.get_window_extent().x1
    plt.close(fig)


def test_plan_html_embeds_the_planner_figures(tmp_path, monkeypatch, rendered):
    source_png = next(p for p in rendered.files if p.suffix == ".png")

    def write_plan_figures(plan, out_dir):
        path = out_dir / "decode_histogram.png"
        path.write_bytes(source_png.read_bytes())
        return [path]

    fake = types.ModuleType("cgtool.reports.plan_figures")
    fake.write_plan_figures = write_plan_figures
    monkeypatch.setitem(sys.modules, "cgtool.reports.plan_figures", fake)
    render_path(PLAN_DIR, tmp_path)
    page = (tmp_path / "plan.html").read_text()
    assert page.count("data:image/png;base64,") == 1
    assert "alt='decode_histogram'" in page


def test_text_from_the_report_is_escaped_in_html(tmp_path):
    report = load_report(REPORT_DIR)
    report.model.name = "<script>alert(1)</script>"
    page = report_html(report, [])
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_extreme_but_valid_values_render(tmp_path):
    report = copy.deepcopy(load_report(OOM_DIR))
    report.sizes[1].retained_bytes = 0  # a size that fits wholly in the pool's free blocks
    report.sizes[2].replay_ms = 1e12
    report.sizes[3].capture_s = 0.0
    report.sizes = report.sizes[:4]
    files = render_report(report, tmp_path)
    assert (tmp_path / "report.html").stat().st_size > 0 and len(files) == 6


def test_size_table_rows_carry_cumulative_memory_and_roofline_share():
    report = load_report(REPORT_DIR)
    table = size_rows(report, "decode")
    assert table.columns[2:5] == ["capture s", "retained MiB", "cumulative MiB"]
    assert table.rows[0][:5] == ["256", "ok", "0.35", "256.0", "256.0"]
    assert table.rows[1][4] == "289.0"  # 256 + 33
    assert table.rows[-1][10] == "80"  # bs 1: roofline 4.79 ms of 6.00 ms replay
    assert to_rich(table).row_count == 36


@pytest.mark.parametrize("kind", ["decode", "piecewise"])
def test_size_table_fits_120_columns_without_cuts_or_wrapped_cells(kind):
    console = Console(width=120, record=True, file=io.StringIO())
    console.print(to_rich(size_rows(load_report(REPORT_DIR), kind)))
    lines = console.export_text().splitlines()
    assert "…" not in "\n".join(lines)
    assert max(len(line.rstrip()) for line in lines) <= 120
    body = [line.split() for line in lines if line.strip()[:1].isdigit()]
    assert len(body) == len(load_report(REPORT_DIR).sizes_of(kind))  # one line per size
    assert all(len(cells) == 13 for cells in body)


def test_markdown_escapes_pipes_and_lists_the_regression():
    baseline = load_report(REPORT_DIR)
    current = copy.deepcopy(baseline)
    current.sizes[5].retained_bytes *= 2
    text = comparison_markdown(compare_reports(baseline, current), "a|b", "cur")
    assert "`a\\|b`" in text
    assert "| decode bs 216 | retained_mem | 30.0 MiB | 60.0 MiB | +100.0% | REGRESSED |" in text


def test_a_report_stopped_before_its_first_size_still_renders(tmp_path):
    report = load_report(REPORT_DIR / "report.json")
    report.sizes = []
    report.status, report.incomplete_reason = "incomplete", "interrupted by SIGTERM during compile"
    written = render_report(report, tmp_path)
    assert (tmp_path / "sizes.csv").read_text().splitlines()[1:] == []
    assert any(path.name == "report.html" for path in written)


def test_size_table_adds_an_experts_column_only_for_moe_rows():
    report = load_report(REPORT_DIR)
    assert "experts" not in size_rows(report, "decode").columns
    for i, row in enumerate(report.sizes_of("decode")):
        row.experts_active = 6.0 + i / 4
    table = size_rows(report, "decode")
    assert table.columns[-1] == "experts"
    assert [r[-1] for r in table.rows[:2]] == ["6.0", "6.2"]
    assert "experts" not in size_rows(report, "piecewise").columns


def test_html_shows_the_timing_spread_and_the_phases_when_the_run_recorded_them(tmp_path):
    import dataclasses

    from cgtool.documents.results import SampleSpread

    report = load_report(REPORT_DIR / "report.json")
    assert "<h2>Timing</h2>" not in report_html(report, [])  # an older report: neither recorded
    totals = dataclasses.replace(report.totals, phase_s={"capture": 4.0, "measure": 1.0},
                                 sample_spread={"decode:replay:short": SampleSpread(0.0012, 18)})
    html = report_html(dataclasses.replace(report, totals=totals), [])
    timing = html[html.index("<h2>Timing</h2>"):]
    assert "Timing spread" in timing and "0.12" in timing and ">18<" in timing
    assert "Phases" in timing and "measure" in timing


def test_totals_show_plain_pytorchs_host_time_beside_the_eager_paths_when_recorded():
    import dataclasses

    from cgtool.reports.tables import totals_rows

    report = load_report(REPORT_DIR / "report.json")
    labels = [row[0] for row in totals_rows(report).rows]
    assert "plain PyTorch host time per kernel" not in labels  # an older report
    totals = dataclasses.replace(report.totals, eager_host_us_per_kernel=25.2,
                                 plain_torch_host_us_per_kernel=9.4)
    rows = dict(totals_rows(dataclasses.replace(report, totals=totals)).rows)
    assert rows["eager host time per kernel"] == "25.2 µs"
    assert rows["plain PyTorch host time per kernel"] == "9.4 µs"


@pytest.mark.parametrize("recorded,shown", [(None, "not recorded"), (True, "on"), (False, "off")])
def test_environment_table_says_whether_one_tokens_moe_launches_were_dependent(recorded, shown):
    from cgtool.reports.tables import environment_rows

    report = load_report(REPORT_DIR)
    report.environment.dependent_launch = recorded
    rows = {row[0]: row[1] for row in environment_rows(report).rows}
    assert rows["dependent launches (one-token MoE)"] == shown
