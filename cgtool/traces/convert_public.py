"""Converters for public request traces: Azure LLM inference and BurstGPT (CSV), Mooncake."""

from __future__ import annotations

import csv
import datetime
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import numpy as np

from cgtool.errors import InputError
from cgtool.traces.fields import (
    a_or_an,
    field_error,
    json_object,
    line_error,
    number_text,
    read_lines,
    seconds,
    time_in_range,
    whole_number,
    whole_number_text,
)
from cgtool.traces.trace import ConvertResult, request_trace

AZURE_REMEDY = (
    "Azure LLM inference traces have the header TIMESTAMP,ContextTokens,GeneratedTokens and "
    "rows like 2023-11-16 18:15:46.6805900,374,44"
)
BURSTGPT_REMEDY = (
    "BurstGPT rows are Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type "
    "with Timestamp in seconds"
)
MOONCAKE_REMEDY = (
    'Mooncake lines look like {"timestamp": 27482, "input_length": 6955, "output_length": 52, '
    '"hash_ids": [46, 47]} with timestamp in milliseconds'
)
EMPTY_PROMPT = "empty prompt (0 tokens)"
FAILED = "failed request (0 response tokens)"
# Mooncake hashes prompts in blocks of 512 tokens (FAST'25 trace README).
MOONCAKE_BLOCK_TOKENS = 512

_AZURE_TIME = re.compile(
    r"(\d{4}-\d{2}-\d{2})[ T](\d{2}):(\d{2}):(\d{2}(?:\.\d*)?)\s*(Z|[+-]\d{2}:?\d{2})?",
    re.ASCII,
)


def csv_rows(
    path: str | Path, columns: tuple[str, ...], what: str, remedy: str
) -> Iterator[tuple[int, list[str]]]:
    """(line number, the named columns' cells) for each data row of a CSV with a header."""
    lines = read_lines(path, what)
    reader = csv.reader(lines)
    try:
        header = next((row for row in reader if any(cell.strip() for cell in row)), None)
        if header is None:
            raise InputError(f"{path} holds no header and no rows", f"Pass {a_or_an(what)}.")
        names = [cell.strip() for cell in header]
        for column in columns:
            if column not in names:
                raise field_error(
                    path, reader.line_num, column, "is missing from the header", remedy
                )
        index = [names.index(column) for column in columns]
        for row in reader:
            if not any(cell.strip() for cell in row):
                continue
            if len(row) <= max(index):
                raise line_error(
                    path,
                    reader.line_num,
                    f"has {len(row)} columns, the header {len(names)}",
                    remedy,
                )
            yield reader.line_num, [row[i] for i in index]
    except csv.Error as exc:
        raise line_error(path, reader.line_num, f"is not valid CSV ({exc})", remedy) from None


def convert_azure(path: str | Path) -> ConvertResult:
    """Azure LLM inference trace: wall-clock arrivals, prompt and output tokens."""
    columns = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
    days, day_s, input_len, output_len = [], [], [], []
    skipped: Counter[str] = Counter()
    read = 0
    ordinals: dict[str, int] = {}  # date text -> day number; a trace spans few days
    for line_no, (stamp, context, generated) in csv_rows(
        path, columns, "Azure trace", AZURE_REMEDY
    ):
        read += 1
        day, second = _azure_time(stamp, path, line_no, ordinals)
        prompt = whole_number_text(context, path, line_no, "ContextTokens", 0, AZURE_REMEDY)
        output = whole_number_text(generated, path, line_no, "GeneratedTokens", 0, AZURE_REMEDY)
        if prompt == 0:
            skipped[EMPTY_PROMPT] += 1
            continue
        days.append(day)
        day_s.append(second)
        input_len.append(prompt)
        output_len.append(output)
    if not input_len:
        return _empty(path, read, skipped)
    # Days and seconds stay apart until here: seconds since year 1 would lose microseconds.
    day_array = np.array(days, dtype=np.int64)
    absolute = (day_array - day_array.min()) * 86400.0 + np.array(day_s)
    arrival = absolute - absolute.min()
    trace = request_trace(str(path), arrival, input_len, output_len, np.zeros(len(arrival)))
    return ConvertResult(trace, read, dict(skipped))


def _azure_time(
    text: str, path: str | Path, line_no: int, ordinals: dict[str, int]
) -> tuple[int, float]:
    match = _AZURE_TIME.fullmatch(text.strip())
    if match is None:
        raise field_error(
            path, line_no, "TIMESTAMP", f"is {text.strip()[:40]!r}, not a time", AZURE_REMEDY
        )
    date_text, hours, minutes, secs, zone = match.groups()
    if date_text not in ordinals:
        try:
            ordinals[date_text] = datetime.date.fromisoformat(date_text).toordinal()
        except ValueError:
            raise field_error(
                path, line_no, "TIMESTAMP", f"has the impossible date {date_text}", AZURE_REMEDY
            ) from None
    if int(hours) > 23 or int(minutes) > 59 or float(secs) >= 61:
        raise field_error(
            path, line_no, "TIMESTAMP", f"has the impossible time in {text.strip()!r}", AZURE_REMEDY
        )
    offset_s = 0.0
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        offset_s = sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    return ordinals[date_text], int(hours) * 3600 + int(minutes) * 60 + float(secs) - offset_s


def convert_burstgpt(path: str | Path) -> ConvertResult:
    """BurstGPT: arrival seconds, request and response tokens; failed requests left out."""
    columns = ("Timestamp", "Request tokens", "Response tokens")
    arrival, input_len, output_len = [], [], []
    skipped: Counter[str] = Counter()
    read = 0
    for line_no, (stamp, request, response) in csv_rows(
        path, columns, "BurstGPT trace", BURSTGPT_REMEDY
    ):
        read += 1
        time_s = number_text(stamp, path, line_no, "Timestamp", BURSTGPT_REMEDY)
        time_s = time_in_range(time_s, path, line_no, "Timestamp", BURSTGPT_REMEDY)
        prompt = whole_number_text(request, path, line_no, "Request tokens", 0, BURSTGPT_REMEDY)
        output = whole_number_text(response, path, line_no, "Response tokens", 0, BURSTGPT_REMEDY)
        # BurstGPT logs a failed request with 0 response tokens (its README); nothing was served.
        reason = EMPTY_PROMPT if prompt == 0 else FAILED if output == 0 else None
        if reason:
            skipped[reason] += 1
            continue
        arrival.append(time_s)
        input_len.append(prompt)
        output_len.append(output)
    if not arrival:
        return _empty(path, read, skipped)
    start = min(arrival)
    relative = [time_s - start for time_s in arrival]
    trace = request_trace(str(path), relative, input_len, output_len, np.zeros(len(relative)))
    return ConvertResult(trace, read, dict(skipped))


def convert_mooncake(path: str | Path, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> ConvertResult:
    """Mooncake: arrival ms, lengths, and prompt-block hashes; cached_len is the prompt prefix
    whose blocks an earlier request already sent (an unbounded prefix cache)."""
    rows = []
    skipped: Counter[str] = Counter()
    lines = read_lines(path, "Mooncake trace (.jsonl)")
    read = 0
    for line_no, text in enumerate(lines, 1):
        if not text.strip():
            continue
        read += 1
        record = json_object(text, path, line_no, MOONCAKE_REMEDY)
        time_s = (
            seconds(record.get("timestamp"), path, line_no, "timestamp", MOONCAKE_REMEDY) / 1000
        )
        prompt = whole_number(
            record.get("input_length"), path, line_no, "input_length", 0, MOONCAKE_REMEDY
        )
        output = whole_number(
            record.get("output_length"), path, line_no, "output_length", 0, MOONCAKE_REMEDY
        )
        blocks = _hash_ids(record.get("hash_ids"), path, line_no)
        if prompt == 0:
            skipped[EMPTY_PROMPT] += 1
            continue
        rows.append((time_s, prompt, output, blocks))
    if not rows:
        return _empty(path, read, skipped)
    rows.sort(key=lambda row: row[0])  # stable: equal timestamps keep file order
    cached = _cached_prefix_lengths([(row[1], row[3]) for row in rows], block_tokens)
    arrival, input_len, output_len, _ = zip(*rows)
    start = arrival[0]
    relative = [time_s - start for time_s in arrival]
    return ConvertResult(
        request_trace(str(path), relative, input_len, output_len, cached), read, dict(skipped)
    )


def _hash_ids(value: object, path: str | Path, line_no: int) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(
        isinstance(block, int) and not isinstance(block, bool) for block in value
    ):
        raise field_error(
            path, line_no, "hash_ids", "must be a list of whole numbers", MOONCAKE_REMEDY
        )
    return value


def _cached_prefix_lengths(requests: list[tuple[int, list[int]]], block_tokens: int) -> list[int]:
    seen: set[int] = set()
    cached = []
    for prompt, blocks in requests:
        hits = 0
        for block in blocks:
            if block not in seen:
                break
            hits += 1
        seen.update(blocks)
        # The last prompt token is always computed, to produce the first output token.
        cached.append(min(hits * block_tokens, prompt - 1))
    return cached


def _empty(path: str | Path, read: int, skipped: Counter[str]) -> NoReturn:
    reasons = ", ".join(f"{count} {reason}" for reason, count in skipped.items()) or "no rows"
    raise InputError(
        f"{path} holds no usable request ({reasons})",
        "Check that this is the right file and format.",
    )
