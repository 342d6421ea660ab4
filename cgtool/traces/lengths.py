"""Traces of prompt and output lengths without arrival times (ShareGPT statistics and the like).

A CSV with a header (columns named like input_len / prompt_tokens and output_len /
completion_tokens, optionally cached_len), or cgtool JSON Lines whose records have no
"arrival". Without arrivals a plan needs a traffic shape: Poisson arrivals at a rate
(`with_poisson_arrivals`, seeded, so a plan is reproducible) or a closed-loop client with a
fixed number of requests in flight (cgtool.planner.scenarios.Traffic).
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cgtool.errors import InputError
from cgtool.traces.fields import (
    field_error,
    json_object,
    read_lines,
    whole_number,
    whole_number_text,
)
from cgtool.traces.trace import RequestTrace, request_trace

# Header names each column is known by (compared in lower case).
INPUT_NAMES = ("input_len", "prompt_len", "input_tokens", "prompt_tokens", "input_length",
               "prompt_length", "contexttokens", "request tokens")
OUTPUT_NAMES = ("output_len", "output_tokens", "completion_tokens", "output_length",
                "response_tokens", "generatedtokens", "response tokens")
CACHED_NAMES = ("cached_len", "cached_tokens")
LENGTHS_REMEDY = (
    "A lengths file is a CSV with a header naming the prompt column (input_len or "
    "prompt_tokens) and the output column (output_len or completion_tokens), or JSON Lines "
    'of {"input_len": N, "output_len": M}'
)
ARRIVAL_REMEDY = (
    "Add --rate R (Poisson arrivals at R requests a second) or --concurrency N (N requests in "
    "flight, a new one sent as one finishes)."
)


@dataclass(frozen=True, eq=False)
class LengthsTrace:
    """Requests in file order, lengths in tokens, no arrival times."""

    source: str
    input_len: np.ndarray  # [n] int64, >= 1
    output_len: np.ndarray  # [n] int64, >= 0
    cached_len: np.ndarray  # [n] int64, < input_len

    def __len__(self) -> int:
        return len(self.input_len)


def has_no_arrivals(path: str | Path) -> bool:
    """Whether the file's first record gives lengths and no arrival time (cheap: one line)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            first = next((line for line in handle if line.strip()), "")
    except OSError:
        return False
    try:
        record = json.loads(first)
    except ValueError:
        header = next(csv.reader(io.StringIO(first)), [])
        timed = any("time" in name.lower() or "arrival" in name.lower() for name in header)
        return not timed and _columns(header) is not None  # Azure's CSV has a TIMESTAMP
    return isinstance(record, dict) and "arrival" not in record and "input_len" in record


def read_lengths(path: str | Path) -> LengthsTrace:
    """A lengths trace from CSV or JSON Lines; one error naming file, line and field."""
    lines = read_lines(path, "lengths file (CSV or .jsonl)")
    rows = [(no, text) for no, text in enumerate(lines, 1) if text.strip()]
    if not rows:
        raise InputError(f"{path} holds no records", LENGTHS_REMEDY)
    if rows[0][1].lstrip().startswith("{"):
        columns = [_json_row(text, path, no) for no, text in rows]
    else:
        columns = _csv_rows(rows, path)
    if not columns:
        raise InputError(f"{path} holds a header and no requests", LENGTHS_REMEDY)
    input_len, output_len, cached_len = (np.array(c, dtype=np.int64) for c in zip(*columns))
    return LengthsTrace(str(path), input_len, output_len, cached_len)


def with_poisson_arrivals(trace: LengthsTrace, rate_per_s: float, seed: int = 0) -> RequestTrace:
    """The requests in file order, sent at exponential gaps of mean 1/rate (first at 0)."""
    if not (rate_per_s > 0 and np.isfinite(rate_per_s)):
        raise InputError(f"--rate {rate_per_s} is not a rate", "Give requests per second above 0.")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate_per_s, len(trace))
    arrival = np.concatenate([[0.0], np.cumsum(gaps[1:])])
    return request_trace(trace.source, arrival, trace.input_len, trace.output_len, trace.cached_len)


def _columns(header: list[str]) -> tuple[int, int, int | None] | None:
    names = [name.strip().lower() for name in header]

    def find(known: tuple[str, ...]) -> int | None:
        return next((i for i, name in enumerate(names) if name in known), None)

    inp, out = find(INPUT_NAMES), find(OUTPUT_NAMES)
    return None if inp is None or out is None else (inp, out, find(CACHED_NAMES))


def _csv_rows(rows: list[tuple[int, str]], path: str | Path) -> list[tuple[int, int, int]]:
    header = next(csv.reader([rows[0][1]]))
    columns = _columns(header)
    if columns is None:
        raise field_error(path, rows[0][0], "header", f"names no prompt and output columns "
                          f"({', '.join(header)[:60]})", LENGTHS_REMEDY)
    inp, out, cached = columns
    result = []
    for (no, _), cells in zip(rows[1:], csv.reader(text for _, text in rows[1:])):
        if len(cells) <= max(inp, out, cached or 0):
            raise field_error(path, no, header[out], "is missing", LENGTHS_REMEDY)
        prompt = whole_number_text(cells[inp], path, no, header[inp], 1, LENGTHS_REMEDY)
        output = whole_number_text(cells[out], path, no, header[out], 0, LENGTHS_REMEDY)
        hit = 0 if cached is None else whole_number_text(cells[cached], path, no, header[cached],
                                                         0, LENGTHS_REMEDY)
        result.append(_checked(prompt, output, hit, path, no))
    return result


def _json_row(text: str, path: str | Path, no: int) -> tuple[int, int, int]:
    record = json_object(text, path, no, LENGTHS_REMEDY)
    prompt = whole_number(record.get("input_len"), path, no, "input_len", 1, LENGTHS_REMEDY)
    output = whole_number(record.get("output_len"), path, no, "output_len", 0, LENGTHS_REMEDY)
    hit = record.get("cached_len")
    hit = 0 if hit is None else whole_number(hit, path, no, "cached_len", 0, LENGTHS_REMEDY)
    return _checked(prompt, output, hit, path, no)


def _checked(prompt: int, output: int, cached: int, path, no: int) -> tuple[int, int, int]:
    if cached >= prompt:
        raise field_error(path, no, "cached_len", f"is {cached}, but must be less than the "
                          f"prompt ({prompt})", LENGTHS_REMEDY)
    return prompt, output, cached
