"""Batch traces from what running servers print: SGLang scheduler logs, vLLM --cudagraph-metrics."""

from __future__ import annotations

import re
from pathlib import Path

from cgtool.errors import InputError
from cgtool.traces.fields import field_error, line_error, read_lines, whole_number_text
from cgtool.traces.trace import ConvertResult, batch_trace

# SGLang's scheduler logs one decode line every --decode-log-interval decode steps (default 40).
SGLANG_DECODE_LOG_INTERVAL = 40
SGLANG_REMEDY = (
    "Pass the log of `python -m sglang.launch_server` at the default --log-level info, "
    "which prints 'Prefill batch. #new-seq: …, #new-token: …' and "
    "'Decode batch. #running-req: …' lines"
)
VLLM_REMEDY = (
    "Pass the log of `vllm serve … --cudagraph-metrics` (without --disable-log-stats), "
    "which prints '| Unpadded Tokens | Padded Tokens | Num Paddings | Runtime Mode | Count |' "
    "tables"
)
EMPTY_BATCH = "empty batch (0 tokens)"

# Releases write "Prefill batch. #new-seq", "Prefill batch, #new-seq" or, with
# SGLANG_LOG_FORWARD_ITERS, "Prefill batch [123], #new-seq"; decode lines likewise.
_SGLANG_PREFILL = re.compile(
    r"Prefill batch(?: \[\d+\])?[.,] #new-seq: (\d+), #new-token: (\d+), #cached-token: (\d+)",
    re.ASCII,
)
_SGLANG_DECODE = re.compile(r"Decode batch(?: \[\d+\])?[.,] #running-req: (\d+)", re.ASCII)

VLLM_COLUMNS = ("Unpadded Tokens", "Runtime Mode", "Count")
VLLM_RUNTIME_MODES = ("NONE", "PIECEWISE", "FULL")
# With these cudagraph modes vLLM runs uniform decode batches as FULL graphs and every
# other batch as PIECEWISE or eager, so FULL rows are decode steps (one token per request
# without speculative decoding). Under FULL or PIECEWISE alone every batch is keyed by its
# token count, and cgtool treats every row as an extend step of that many tokens.
_VLLM_SPLIT_MODES = ("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY")
_VLLM_CONFIG_MODE = re.compile(r"- Mode: (\w+)", re.ASCII)


def convert_sglang_log(
    path: str | Path, decode_log_interval: int = SGLANG_DECODE_LOG_INTERVAL
) -> ConvertResult:
    """Extend steps from 'Prefill batch' lines (#new-token: tokens computed, cached prefix
    excluded) and decode steps from 'Decode batch' lines, each standing for
    `decode_log_interval` steps, as the scheduler logs only one in that many."""
    rows: list[tuple[str, int, int]] = []
    for line_no, text in enumerate(read_lines(path, "SGLang server log"), 1):
        prefill = _SGLANG_PREFILL.search(text)
        decode = None if prefill else _SGLANG_DECODE.search(text)
        if prefill:
            tokens = whole_number_text(
                prefill.group(2), path, line_no, "#new-token", 0, SGLANG_REMEDY
            )
            rows.append(("extend", tokens, 1))
        elif decode:
            size = whole_number_text(
                decode.group(1), path, line_no, "#running-req", 0, SGLANG_REMEDY
            )
            rows.append(("decode", size, decode_log_interval))
    return _batch_result(path, rows, "'Prefill batch' or 'Decode batch' line", SGLANG_REMEDY)


def convert_vllm_metrics(path: str | Path) -> ConvertResult:
    """Steps from every CUDAGraph Stats table in a vLLM log, summed over tables."""
    rows: list[tuple[str, int, int]] = []
    config_mode: str | None = None
    columns: dict[str, int] | None = None  # set while inside a table
    for line_no, text in enumerate(read_lines(path, "vLLM log"), 1):
        mode_match = _VLLM_CONFIG_MODE.search(text)
        if mode_match:
            config_mode = mode_match.group(1)
        cells = _table_cells(text)
        if cells is None:
            columns = None
        elif "Unpadded Tokens" in cells:
            columns = _vllm_header(cells, path, line_no)
        elif columns is not None and not _is_separator(cells):
            rows.append(_vllm_row(cells, columns, config_mode, path, line_no))
    return _batch_result(path, rows, "CUDAGraph Stats table", VLLM_REMEDY)


def _batch_result(
    path: str | Path, rows: list[tuple[str, int, int]], wanted: str, remedy: str
) -> ConvertResult:
    """Every (kind, size, steps) row read counts; rows of size 0 are left out as empty batches."""
    kept = [row for row in rows if row[1] > 0]
    if not kept:
        raise InputError(f"{path} holds no {wanted}", remedy)
    skipped = {EMPTY_BATCH: len(rows) - len(kept)} if len(kept) < len(rows) else {}
    return ConvertResult(batch_trace(str(path), kept), len(rows), skipped)


def _table_cells(text: str) -> list[str] | None:
    # vLLM may prefix each line ("(EngineCore_DP0 pid=42) "): the table starts at the first bar.
    start, end = text.find("|"), text.rfind("|")
    if start < 0 or end == start:
        return None
    return [cell.strip() for cell in text[start + 1 : end].split("|")]


def _is_separator(cells: list[str]) -> bool:
    return all(cell and set(cell) <= set("-:") for cell in cells)


def _vllm_header(cells: list[str], path: str | Path, line_no: int) -> dict[str, int]:
    for column in VLLM_COLUMNS:
        if column not in cells:
            raise field_error(
                path, line_no, column, "is missing from the table header", VLLM_REMEDY
            )
    return {column: cells.index(column) for column in VLLM_COLUMNS}


def _vllm_row(
    cells: list[str],
    columns: dict[str, int],
    config_mode: str | None,
    path: str | Path,
    line_no: int,
) -> tuple[str, int, int]:
    if len(cells) <= max(columns.values()):
        raise line_error(
            path, line_no, f"has {len(cells)} table cells, the header more", VLLM_REMEDY
        )
    tokens = whole_number_text(
        cells[columns["Unpadded Tokens"]], path, line_no, "Unpadded Tokens", 0, VLLM_REMEDY
    )
    count = whole_number_text(cells[columns["Count"]], path, line_no, "Count", 1, VLLM_REMEDY)
    runtime_mode = cells[columns["Runtime Mode"]]
    if runtime_mode not in VLLM_RUNTIME_MODES:
        raise field_error(
            path,
            line_no,
            "Runtime Mode",
            f"is {runtime_mode[:40]!r}, not one of {', '.join(VLLM_RUNTIME_MODES)}",
            VLLM_REMEDY,
        )
    splits_decode = config_mode is None or config_mode in _VLLM_SPLIT_MODES
    kind = "decode" if runtime_mode == "FULL" and splits_decode else "extend"
    return kind, tokens, count
