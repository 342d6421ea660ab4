"""cgtool's trace format (JSON Lines): requests, or batches as a server ran them.

Request lines: {"arrival": 12.5, "input_len": 812, "output_len": 230, "cached_len": 0}
(seconds from the trace's start; tokens; cached_len optional, the prompt prefix a radix
cache already holds; images optional, one [height, width] in pixels per image the request
carries). Batch lines: {"mode": "decode", "batch_size": 37} or
{"mode": "extend", "num_tokens": 1904}, each with an optional "count" of how many steps
it stands for. A file holds one kind; other keys are ignored.
"""

from __future__ import annotations

import gc
import json
import json.scanner
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cgtool.errors import InputError
from cgtool.traces.fields import (
    MAX_ARRIVAL_S,
    MAX_TOKENS,
    field_error,
    json_object,
    read_lines,
    seconds,
    show,
    whole_number,
)

REQUEST_REMEDY = (
    "Each request line needs arrival (seconds, >= 0), input_len (>= 1), output_len (>= 0) "
    "and optionally cached_len (< input_len) and images ([[height, width], ...] in pixels); "
    "see docs/traces.md"
)
BATCH_REMEDY = (
    'Each batch line is {"mode": "decode", "batch_size": N} or {"mode": "extend", '
    '"num_tokens": N} with N >= 1 and an optional "count" >= 1; see docs/traces.md'
)
LINE_REMEDY = "Each line must be one JSON object; see docs/traces.md"
BATCH_SIZE_FIELD = {"decode": "batch_size", "extend": "num_tokens"}


@dataclass(frozen=True, eq=False)
class RequestTrace:
    """Requests sorted by arrival; every length in tokens."""

    source: str
    arrival_s: np.ndarray  # [n] float64, non-decreasing
    input_len: np.ndarray  # [n] int64, >= 1
    output_len: np.ndarray  # [n] int64, >= 0
    cached_len: np.ndarray  # [n] int64, 0 <= cached_len < input_len
    # [n] object: each a tuple of (height, width) pixel pairs; None when no request has images.
    images: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.arrival_s)

    def take(self, keep: np.ndarray) -> RequestTrace:
        """The requests selected by a boolean mask or an index array, order kept."""
        return RequestTrace(
            self.source,
            self.arrival_s[keep],
            self.input_len[keep],
            self.output_len[keep],
            self.cached_len[keep],
            None if self.images is None else self.images[keep],
        )


@dataclass(frozen=True, eq=False)
class BatchTrace:
    """Forward steps as a server ran them: each size with the number of steps it stands for."""

    source: str
    decode_batch_size: np.ndarray  # [d] int64, requests per decode step
    decode_count: np.ndarray  # [d] int64, steps
    extend_num_tokens: np.ndarray  # [e] int64, new tokens per extend step
    extend_count: np.ndarray  # [e] int64, steps

    def __len__(self) -> int:
        return int(self.decode_count.sum() + self.extend_count.sum())


@dataclass(frozen=True)
class ConvertResult:
    """A converter's output: the trace, how many source records it read, and what it left out."""

    trace: RequestTrace | BatchTrace
    records_read: int
    skipped: dict[str, int]  # reason -> records left out


def request_trace(
    source: str,
    arrival_s: list[float] | np.ndarray,
    input_len: list[int] | np.ndarray,
    output_len: list[int] | np.ndarray,
    cached_len: list[int] | np.ndarray,
    images: list[tuple[tuple[int, int], ...]] | np.ndarray | None = None,
) -> RequestTrace:
    """Build a RequestTrace from columns, sorting by arrival (stable, so ties keep file order).

    `images` holds each request's (height, width) pairs; a trace where no request has one
    keeps None, so traces without images cost nothing extra.
    """
    arrival = np.asarray(arrival_s, dtype=np.float64)
    order = np.argsort(arrival, kind="stable")
    image_column = None
    if images is not None and any(len(pairs) for pairs in images):
        image_column = np.empty(len(arrival), dtype=object)
        image_column[:] = [tuple(pairs) for pairs in images]
        image_column = image_column[order]
    return RequestTrace(
        source,
        arrival[order],
        np.asarray(input_len, dtype=np.int64)[order],
        np.asarray(output_len, dtype=np.int64)[order],
        np.asarray(cached_len, dtype=np.int64)[order],
        image_column,
    )


def batch_trace(source: str, rows: list[tuple[str, int, int]]) -> BatchTrace:
    """Build a BatchTrace from (mode, size, count) rows, in the order given."""
    decode = [(size, count) for mode, size, count in rows if mode == "decode"]
    extend = [(size, count) for mode, size, count in rows if mode == "extend"]
    decode_cols = np.array(decode, dtype=np.int64).reshape(-1, 2)
    extend_cols = np.array(extend, dtype=np.int64).reshape(-1, 2)
    return BatchTrace(
        source, decode_cols[:, 0], decode_cols[:, 1], extend_cols[:, 0], extend_cols[:, 1]
    )


def read_trace(path: str | Path) -> RequestTrace | BatchTrace:
    """Read a cgtool trace; the first record decides whether it holds requests or batches."""
    lines = read_lines(path, "cgtool trace (.jsonl)")
    fast = _read_valid_fast(lines, str(path))
    if fast is not None:
        return fast
    # Something is off: the line-by-line reader finds it and names file, line and field.
    records = [(no, _record(text, path, no)) for no, text in enumerate(lines, 1) if text.strip()]
    if not records:
        raise InputError(
            f"{path} holds no records", "Convert a trace first with `cgtool trace convert`."
        )
    if "mode" in records[0][1]:
        return batch_trace(str(path), [_batch_row(rec, path, no) for no, rec in records])
    columns = list(zip(*(_request_row(rec, path, no) for no, rec in records)))
    return request_trace(str(path), *columns)


# The C scanner behind json.loads, without its per-call wrapper: a million lines parse
# in ~1.5 s instead of ~2.6 s. It returns (object, end) and needs no leading whitespace.
_scan_json = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[attr-defined]


def _read_valid_fast(lines: list[str], source: str) -> RequestTrace | BatchTrace | None:
    """Whole-column parsing for well-formed files (the usual case); None at the first doubt."""
    # A million fresh dicts and nothing cyclic: the collector's passes over them would cost
    # more than the parse itself.
    collecting = gc.isenabled()
    gc.disable()
    try:
        records = _scan_records(lines)
    finally:
        if collecting:
            gc.enable()
    if records is None:
        return None
    if not records or set(map(type, records)) != {dict}:
        return None
    if "mode" in records[0]:
        return None  # batch files are small: the line-by-line reader is fast enough
    if any("images" in record for record in records):
        return None  # image lists are checked pair by pair on the line-by-line path
    arrival_s = _number_column(records, "arrival", np.float64)
    input_len = _number_column(records, "input_len", np.int64)
    output_len = _number_column(records, "output_len", np.int64)
    cached_len = _number_column(records, "cached_len", np.int64, optional=True)
    if arrival_s is None or input_len is None or output_len is None or cached_len is None:
        return None
    valid = (
        np.isfinite(arrival_s).all()
        and (arrival_s >= 0).all()
        and (arrival_s <= MAX_ARRIVAL_S).all()
        and (input_len >= 1).all()
        and (input_len <= MAX_TOKENS).all()
        and (output_len >= 0).all()
        and (output_len <= MAX_TOKENS).all()
        and (cached_len >= 0).all()
        and (cached_len < input_len).all()
    )
    if not valid:
        return None
    return request_trace(source, arrival_s, input_len, output_len, cached_len)


def _scan_records(lines: list[str]) -> list[Any] | None:
    records = []
    try:
        for text in lines:
            if not text or text.isspace():
                continue
            record, end = _scan_json(text, 0)
            if end != len(text):
                return None
            records.append(record)
    except (ValueError, StopIteration, RecursionError):
        return None
    return records


def _number_column(
    records: list[dict], field: str, dtype: type, optional: bool = False
) -> np.ndarray | None:
    values = [record.get(field) for record in records]
    kinds = set(map(type, values))
    if optional and type(None) in kinds:
        values = [0 if value is None else value for value in values]
        kinds.discard(type(None))
    allowed = {int, float} if dtype is np.float64 else {int}
    if not kinds <= allowed:
        return None  # a string, a bool, a float token count: let the slow path judge it
    try:
        column = np.array(values, dtype=dtype)
    except OverflowError:
        return None
    return column


def _record(text: str, path: str | Path, line_no: int) -> dict:
    return json_object(text, path, line_no, LINE_REMEDY)


def _request_row(
    record: dict, path: str | Path, line_no: int
) -> tuple[float, int, int, int, tuple[tuple[int, int], ...]]:
    arrival_s = seconds(record.get("arrival"), path, line_no, "arrival", REQUEST_REMEDY)
    input_len = whole_number(record.get("input_len"), path, line_no, "input_len", 1, REQUEST_REMEDY)
    output_len = whole_number(
        record.get("output_len"), path, line_no, "output_len", 0, REQUEST_REMEDY
    )
    cached_len = 0
    if record.get("cached_len") is not None:
        cached_len = whole_number(
            record["cached_len"], path, line_no, "cached_len", 0, REQUEST_REMEDY
        )
        if cached_len >= input_len:
            raise field_error(
                path,
                line_no,
                "cached_len",
                f"is {cached_len}, but must be less than input_len ({input_len}): "
                "a server always computes the last prompt token",
                REQUEST_REMEDY,
            )
    return arrival_s, input_len, output_len, cached_len, _images(record, path, line_no)


def _images(record: dict, path: str | Path, line_no: int) -> tuple[tuple[int, int], ...]:
    value = record.get("images")
    if value is None:
        return ()
    if not isinstance(value, list):
        raise field_error(
            path,
            line_no,
            "images",
            f"is {show(value)}, not a list of [height, width] pairs",
            REQUEST_REMEDY,
        )
    pairs = []
    for index, pair in enumerate(value):
        field = f"images[{index}]"
        if not isinstance(pair, list) or len(pair) != 2:
            raise field_error(
                path,
                line_no,
                field,
                f"is {show(pair)}, not a [height, width] pair",
                REQUEST_REMEDY,
            )
        height = whole_number(pair[0], path, line_no, f"{field} height", 1, REQUEST_REMEDY)
        width = whole_number(pair[1], path, line_no, f"{field} width", 1, REQUEST_REMEDY)
        pairs.append((height, width))
    return tuple(pairs)


def _batch_row(record: dict, path: str | Path, line_no: int) -> tuple[str, int, int]:
    mode = record.get("mode")
    if mode not in BATCH_SIZE_FIELD:
        problem = "is missing" if mode is None else f"is {json.dumps(mode)[:40]}"
        raise field_error(
            path, line_no, "mode", f'{problem}; it must be "decode" or "extend"', BATCH_REMEDY
        )
    size_field = BATCH_SIZE_FIELD[mode]
    size = whole_number(record.get(size_field), path, line_no, size_field, 1, BATCH_REMEDY)
    count = 1
    if record.get("count") is not None:
        count = whole_number(record["count"], path, line_no, "count", 1, BATCH_REMEDY)
    return mode, size, count


def write_trace(trace: RequestTrace | BatchTrace, path: str | Path) -> None:
    """Write a trace as cgtool JSON Lines, atomically (a reader never sees half a file)."""
    path = Path(path)
    lines = _request_lines(trace) if isinstance(trace, RequestTrace) else _batch_lines(trace)
    # Opened by name (not mkstemp) so the file gets the user's umask, not mode 0600.
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temp, "w", encoding="utf-8") as out:
            out.writelines(lines)
        os.replace(temp, path)
    except OSError as exc:
        temp.unlink(missing_ok=True)
        raise InputError(
            f"cannot write {path} ({exc.strerror})", "Check the output folder."
        ) from None
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def _request_lines(trace: RequestTrace) -> list[str]:
    # round() to microseconds keeps files short; repr of a float is valid JSON for finite values.
    arrival = [repr(round(a, 6)) for a in trace.arrival_s.tolist()]
    columns = zip(
        arrival, trace.input_len.tolist(), trace.output_len.tolist(), trace.cached_len.tolist()
    )
    lines = [
        f'{{"arrival": {a}, "input_len": {i}, "output_len": {o}, "cached_len": {c}'
        for a, i, o, c in columns
    ]
    if trace.images is not None:
        lines = [
            line + (f', "images": {json.dumps([list(p) for p in pairs])}' if pairs else "")
            for line, pairs in zip(lines, trace.images)
        ]
    return [line + "}\n" for line in lines]


def _batch_lines(trace: BatchTrace) -> list[str]:
    lines = []
    for mode, sizes, counts in (
        ("decode", trace.decode_batch_size, trace.decode_count),
        ("extend", trace.extend_num_tokens, trace.extend_count),
    ):
        field = BATCH_SIZE_FIELD[mode]
        for size, count in zip(sizes.tolist(), counts.tolist()):
            tail = "" if count == 1 else f', "count": {count}'
            lines.append(f'{{"mode": "{mode}", "{field}": {size}{tail}}}\n')
    return lines
