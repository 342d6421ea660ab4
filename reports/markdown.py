"""Markdown for CI job summaries (GitHub's $GITHUB_STEP_SUMMARY renders tables and <details>)."""

from __future__ import annotations

from cgtool.documents.compare import Comparison
from cgtool.reports.tables import TableData, comparison_rows, for_people, limits_text


def table_markdown(data: TableData) -> str:
    data = for_people(data)
    lines = [
        "| " + " | ".join(data.columns) + " |",
        "| " + " | ".join("---" if i == 0 else "---:" for i in range(len(data.columns))) + " |",
    ]
    for i, row in enumerate(data.rows):
        cells = [_escape(c) for c in row]
        if i in data.marked:
            cells = [f"**{c}**" for c in cells]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def comparison_markdown(comparison: Comparison, baseline_name: str, current_name: str) -> str:
    """A verdict line, the regressions, added/removed sizes, then every row folded away."""
    verdict = ("**PASS**: no regression" if comparison.passed
               else f"**FAIL**: {len(comparison.regressions)} regression(s)")
    parts = [
        f"## cgtool check: {verdict}",
        (f"Baseline `{_escape(baseline_name)}`, current `{_escape(current_name)}`; "
         f"limits {limits_text(comparison)}."),
    ]
    if comparison.regressions:
        full = for_people(comparison_rows(comparison))
        parts.append(table_markdown(TableData("", full.columns,
                                              [full.rows[i] for i in sorted(full.marked)])))
    if comparison.added:
        parts.append("Sizes only in current: " + ", ".join(comparison.added))
    if comparison.removed:
        parts.append("Sizes only in baseline: " + ", ".join(comparison.removed))
    parts += [f"> warning: {_escape(w)}" for w in comparison.warnings]
    parts.append("<details><summary>All sizes</summary>\n\n"
                 + table_markdown(comparison_rows(comparison)) + "\n\n</details>")
    return "\n\n".join(parts) + "\n"


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
