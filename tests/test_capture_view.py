"""Remedies after an out-of-memory capture, in SGLang's order, with the amounts."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from cgtool.capture.options import CaptureFailure
from cgtool.documents.results import load_report
from cgtool.reports.capture_view import print_capture_summary, remedies

OOM_REPORT = Path(__file__).parent / "data" / "reports" / "h100-llama-3.1-8b-oom" / "report.json"
GIB = 1 << 30


def test_remedies_name_the_largest_size_that_fitted_then_the_fraction_to_give_up():
    report = load_report(OOM_REPORT)  # decode 256 failed, 248 and below fitted, fraction 0.88
    failure = CaptureFailure("decode", 256, int(0.21 * GIB), int(1.2 * GIB), 80 * GIB)
    lines = remedies(report, failure)
    assert lines[0] == "lower --cuda-graph-max-bs to 248, the largest size that fitted"
    # 1.2 GiB of 80 GiB is 0.015 of the device: the fraction must fall at least that much.
    assert lines[1].startswith("or lower --mem-fraction-static by at least 0.015 (to 0.865)")
    assert len(lines) == 2  # token bins only matter for piecewise failures


def test_piecewise_failure_also_suggests_dropping_token_bins():
    report = load_report(OOM_REPORT)
    failure = CaptureFailure("piecewise", 8192, 0, 0, 80 * GIB)
    lines = remedies(report, failure)
    assert lines[0] == "lower --piecewise-cuda-graph-max-tokens below 8192"  # no piecewise size fitted
    assert lines[1] == "or lower --mem-fraction-static below 0.88 to leave the graphs more room"
    assert lines[2] == "or drop the largest token bins (--tokens)"


def test_summary_prints_the_reason_and_remedies(tmp_path):
    report = load_report(OOM_REPORT)
    console = Console(record=True, width=200)
    failure = CaptureFailure("decode", 256, int(0.21 * GIB), int(1.2 * GIB), 80 * GIB)
    print_capture_summary(console, report, failure, [tmp_path / "report.json"])
    text = console.export_text()
    assert "incomplete: out of memory capturing decode bs 256" in text
    assert "- lower --cuda-graph-max-bs to 248" in text
    assert f"wrote {tmp_path / 'report.json'}" in text


def test_phase_table_lists_phases_in_session_order_with_their_share():
    import dataclasses

    from cgtool.documents.results import load_report
    from cgtool.reports.tables import phase_rows

    report = load_report(Path(__file__).parent / "data/reports/h100-llama-3.1-8b/report.json")
    report = dataclasses.replace(report, totals=dataclasses.replace(
        report.totals, phase_s={"measure": 3.0, "load": 1.0, "capture": 4.0, "render": 2.0}))
    table = phase_rows(report)
    assert [r[0] for r in table.rows] == ["load", "capture", "measure", "render"]
    assert table.columns == ["phase", "time s", "share %"]
    assert [r[2] for r in table.rows] == ["10", "40", "30", "20"]


def test_phase_table_says_whether_the_compile_cache_served_the_compile_phase():
    import dataclasses

    from cgtool.reports.tables import phase_rows

    report = load_report(Path(__file__).parent / "data/reports/h100-llama-3.1-8b/report.json")
    report = dataclasses.replace(report, totals=dataclasses.replace(
        report.totals, phase_s={"load": 1.0, "compile": 0.5}, compile_cache="hit"))
    assert [r[0] for r in phase_rows(report).rows] == ["load", "compile (cache hit)"]


def test_the_summary_states_the_pooled_spread_every_interval_comes_from():
    import dataclasses

    from cgtool.documents.results import SampleSpread

    report = load_report(Path(__file__).parent / "data/reports/h100-llama-3.1-8b/report.json")
    spread = {"decode:eager:short": SampleSpread(0.1234, 35), "piecewise:replay:long": SampleSpread(0.008, 3)}
    report = dataclasses.replace(report, totals=dataclasses.replace(report.totals, sample_spread=spread))
    console = Console(record=True, width=200)
    print_capture_summary(console, report, None, [])
    text = console.export_text()
    assert "Timing spread" in text
    lines = [line.split() for line in text.splitlines()]
    assert ["decode", "eager", "short", "calls", "12.34", "35"] in lines
    assert ["piecewise", "replay", "long", "calls", "0.80", "3"] in lines


def test_a_capture_of_decode_graphs_alone_says_a_server_replays_them_slower():
    # A lone decode set replays in the fast state (benchmarks/results/h200-2026-11-28-graph-gaps):
    # the summary says what a server adds, on the report's own kernels; with prefill graphs
    # captured as well the replays were timed as a server runs them, and nothing is said.
    import dataclasses

    from cgtool.planner.cost import SERVER_GRAPH_GAP_MS

    both = load_report(Path(__file__).parent / "data/reports/h100-llama-3.1-8b/report.json")
    alone = dataclasses.replace(
        both, settings=dataclasses.replace(both.settings, kinds=["decode"]),
        sizes=[s for s in both.sizes if s.kind == "decode"])
    texts = []
    for report in (both, alone):
        console = Console(record=True, width=300)
        print_capture_summary(console, report, None, [])
        texts.append(console.export_text())
    assert "no prefill graph" not in texts[0]
    gap_ms = 452 * SERVER_GRAPH_GAP_MS  # the fixture's 452 kernels a forward
    assert f"about {gap_ms:.2f} ms a step here (452 kernels)" in texts[1]
    assert "--kind both" in texts[1]


def test_a_capture_whose_mla_decode_redid_chunks_says_where_and_how_to_turn_it_off():
    # attention.redone_chunks counts the chunks stage 1 did twice; the summary names the sizes
    # and the worst, the decode table shows the column, and a report of zeros says nothing.
    import dataclasses

    from cgtool.reports.tables import size_rows

    report = load_report(Path(__file__).parent / "data/reports/h100-llama-3.1-8b/report.json")
    decode = report.sizes_of("decode")
    counts = {row.size: 0 for row in decode} | {decode[0].size: 54, decode[1].size: 3}
    sizes = [dataclasses.replace(s, mla_chunks_redone=counts[s.size]) if s.kind == "decode" else s
             for s in report.sizes]
    texts = []
    for redone in (sizes, [dataclasses.replace(s, mla_chunks_redone=0 if s.kind == "decode" else None)
                           for s in report.sizes]):
        console = Console(record=True, width=300)
        print_capture_summary(console, dataclasses.replace(report, sizes=redone), None, [])
        texts.append(console.export_text())
    assert f"did chunks twice at 2 batch size(s) (bs {decode[0].size}: 54 in one replay)" in texts[0]
    assert "CGTOOL_MLA_FIXED_MAX=0" in texts[0]
    assert "did chunks twice" not in texts[1]
    table = size_rows(dataclasses.replace(report, sizes=sizes), "decode")
    assert table.columns[-1] == "MLA redone"
    assert [row[-1] for row in table.rows][:2] == ["54", "3"]
    assert "MLA redone" not in size_rows(report, "decode").columns  # not counted: no column
