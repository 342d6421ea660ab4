"""Tables of a tensor-parallel report: every rank's rows and totals, and the spread between ranks."""

from __future__ import annotations

from cgtool.capture.ranks import rank_spread
from cgtool.documents.results import SIZE_UNITS, CaptureReport
from cgtool.reports.tables import TableData, mib_number


def rank_tables(report: CaptureReport) -> list[TableData]:
    """Nothing at TP=1; otherwise per-rank sizes for each kind, per-rank totals, the spread."""
    if report.settings.tp_size == 1:
        return []
    tables = [rank_size_rows(report, kind) for kind in report.kinds()]
    if report.rank_totals:
        tables.append(rank_totals_rows(report))
    tables.append(spread_rows(report))
    return tables


def _ms(value: float | None, unit: str = " ms", digits: int = 3) -> str:
    return "-" if value is None else f"{value:,.{digits}f}{unit}"


def rank_size_rows(report: CaptureReport, kind: str) -> TableData:
    columns = [SIZE_UNITS[kind], "rank", "status", "capture s",
               "retained MiB", "peak MiB", "non-torch MiB", "eager ms", "replay ms", "max |diff|"]
    rows, marked = [], set()
    for head in report.sizes_of(kind):
        for rank in range(report.settings.tp_size):
            row = next((s for s in report.sizes_of(kind, rank) if s.size == head.size), None)
            if row is None:
                continue
            if row.status != "ok":
                marked.add(len(rows))
            rows.append([str(row.size), str(rank), row.status, _ms(row.capture_s, "", 2),
                         mib_number(row.retained_bytes), mib_number(row.peak_bytes),
                         mib_number(row.non_torch_bytes), _ms(row.eager_ms, ""),
                         _ms(row.replay_ms, ""),
                         "-" if row.max_abs_diff is None else f"{row.max_abs_diff:.3g}"])
    return TableData(f"{kind} graphs per rank", columns, rows, marked)


def rank_totals_rows(report: CaptureReport) -> TableData:
    columns = ["rank", "weights MiB", "KV pool MiB", "KV tokens", "graph pool MiB",
               "non-torch MiB", "peak MiB", "free after capture MiB", "capture s"]
    rows = [[str(rank), mib_number(t.weights_bytes), mib_number(t.kv_pool_bytes),
             f"{t.kv_tokens:,}", mib_number(t.graph_pool_bytes), mib_number(t.non_torch_bytes),
             mib_number(t.peak_bytes), mib_number(t.free_after_capture_bytes),
             _ms(t.capture_s, "", 2)]
            for rank, t in enumerate(report.rank_totals)]
    return TableData("Totals per rank", columns, rows)


def spread_rows(report: CaptureReport) -> TableData:
    """Max minus min over the ranks, with the rank that holds the max in brackets."""
    columns = ["size", "retained MiB", "peak MiB", "non-torch MiB", "capture s", "replay ms"]
    rows = []
    for r in rank_spread(report):
        label = f"{r.kind} {'bs ' if r.kind == 'decode' else ''}{r.size}"
        cells = [mib_number(r.spread[f]) for f in ("retained_bytes", "peak_bytes", "non_torch_bytes")]
        cells += [_ms(r.spread["capture_s"], "", 2), _ms(r.spread["replay_ms"], "")]
        names = ("retained_bytes", "peak_bytes", "non_torch_bytes", "capture_s", "replay_ms")
        rows.append([label] + [f"{c} (r{r.highest_rank[n]})" for c, n in zip(cells, names)])
    return TableData("Spread between ranks (max - min; rank of the max)", columns, rows)
