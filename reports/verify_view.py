"""`cgtool verify`'s tables: built once as TableData, shown in the terminal and in HTML."""

from __future__ import annotations

from rich.console import Console

from cgtool.reports.tables import TableData, mib, to_rich
from cgtool.verify.result import VerifyResult


def _ms(value: float) -> str:
    return f"{value:,.3f}"


def _error(measured: float, predicted: float) -> str:
    return f"{100 * (predicted - measured) / measured:+.0f}%" if measured else "-"


def summary_rows(result: VerifyResult) -> TableData:
    rows, marked = [], set()
    for s in result.sets:
        rows.append([s.name, _ms(s.mean_step_ms), _ms(s.predicted_step_ms), _ms(s.plan_expected_step_ms),
                     _error(s.mean_step_ms, s.predicted_step_ms), mib(s.graph_bytes),
                     mib(s.predicted_graph_bytes), f"{s.capture_s:.1f}", f"{s.predicted_capture_s:.1f}",
                     f"{s.compile_s:.1f}", str(len(s.capture_bs) + len(s.capture_num_tokens))])
        if s.failed_sizes:
            marked.add(len(rows) - 1)
    columns = ["graph set", "step ms", "predicted ms", "plan.json ms", "error", "graph mem",
               "predicted mem", "capture s", "predicted s", "compile s", "graphs"]
    return TableData("Measured vs predicted (sampled steps, weighted to the simulation)", columns, rows, marked)


def kind_rows(result: VerifyResult) -> TableData:
    rows = []
    for s in result.sets:
        for k in s.kinds:
            rows.append([f"{s.name} {k.kind}", f"{k.weight:,.0f}", _ms(k.measured_ms),
                         _ms(k.predicted_ms), _error(k.measured_ms, k.predicted_ms)])
    return TableData("Step time per kind", ["set and kind", "steps", "measured ms", "predicted ms", "error"], rows)


def ratio_rows(result: VerifyResult) -> TableData:
    r = result.ratio
    if r is None:
        return TableData("Plan / default", ["", "value"], [["not measured", result.reason or ""]])
    rows = [["plan / default step time", f"{r.mean:.3f}"],
            [f"{r.confidence:.0%} interval over {len(r.repeats)} repeats", f"{r.ci_low:.3f} .. {r.ci_high:.3f}"],
            ["verdict", {"faster": "plan faster", "slower": "plan SLOWER", "same": "no difference beyond noise"}[r.verdict]]]
    return TableData("Plan against the default", ["", "value"], rows, {2} if r.verdict == "slower" else set())


def rehearsal_rows(result: VerifyResult) -> TableData:
    h, s = result.rehearsal, result.settings
    rows = [["--mem-fraction-static", f"{s.mem_fraction_static:g} (from the {s.fraction_source})"],
            ["KV pool", f"{s.kv_tokens:,} tokens"],
            ["eager extend", f"{h.extend_tokens:,} tokens"],
            ["eager decode", f"{h.decode_bs:,} requests x {h.decode_context:,} tokens"],
            ["status", h.status], ["peak", mib(h.peak_bytes)], ["headroom", mib(h.headroom_bytes)]]
    if h.failed_step:
        rows += [["ran out of memory", h.failed_step], ["remedy", h.remedy or ""]]
    return TableData("Memory rehearsal at the plan's fraction", ["", "value"], rows,
                     {4} if h.status == "oom" else set())


def proof_rows(result: VerifyResult) -> TableData:
    """The fraction that leaves --headroom free, proven by a second build and rehearsal."""
    p, rows = result.proof, []
    if p is not None:
        h = p.rehearsal
        rows += [["proven at", f"{p.mem_fraction_static:g} ({p.kv_tokens:,} KV tokens)"],
                 ["status", h.status], ["headroom", f"{mib(h.headroom_bytes)} (asked {mib(p.headroom_target_bytes)})"],
                 ["graphs", mib(p.graph_bytes)]]
        if h.failed_step:
            rows.append(["ran out of memory", h.failed_step])
    recommended = result.recommended_mem_fraction_static
    rows.append(["recommended", "none" if recommended is None else f"{recommended:g}"])
    if result.recommended_kv_tokens is not None:
        rows.append(["KV tokens a fresh server gets there", f"{result.recommended_kv_tokens:,}"])
    if result.default_kv_tokens is not None:
        rows.append(["SGLang default's KV tokens", f"{result.default_kv_tokens:,}"])
    return TableData("Largest safe fraction", ["", "value"], rows,
                     {1} if p is not None and p.rehearsal.status == "oom" else set())


def verify_tables(result: VerifyResult) -> list[TableData]:
    tables = [rehearsal_rows(result)]
    if result.proof is not None or result.recommended_mem_fraction_static is not None:
        tables.append(proof_rows(result))
    if result.sets:
        tables += [summary_rows(result), kind_rows(result), ratio_rows(result)]
    return tables


def print_verify(console: Console, result: VerifyResult) -> None:
    for table in verify_tables(result):
        console.print(to_rich(table), soft_wrap=True)
    for warning in result.warnings:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    console.print(verdict_line(result), highlight=False, soft_wrap=True)


def verdict_line(result: VerifyResult) -> str:
    if result.status == "oom":
        return f"FAIL: {result.reason}. {result.rehearsal.remedy or ''}".strip()
    r = result.ratio
    assert r is not None
    head = "FAIL: the plan is slower than the default" if r.verdict == "slower" else "OK"
    return (f"{head}: plan/default step time {r.mean:.3f} ({r.ci_low:.3f}..{r.ci_high:.3f}), "
            f"headroom {mib(result.rehearsal.headroom_bytes)} at --mem-fraction-static "
            f"{result.settings.mem_fraction_static:g}")
