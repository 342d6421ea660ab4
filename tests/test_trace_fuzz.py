"""Fuzzing cgtool's trace reader (issue 7): random bytes, truncated lines, wrong types, huge and
negative numbers, missing fields, unicode. Every failure is an InputError naming the file and
the line (and the field, where one field is at fault); nothing else may escape.

Generated cases per run, stated on each test: 100 + 200 + 100 + 200 (x 6 formats) + 50 + 60 = 710
files, 1,710 parses.
"""

from __future__ import annotations

import json
import math
import re
import string
from pathlib import Path

import numpy as np
from fuzzing import fuzz, fuzz_file, spoil_one_record
from hypothesis import example, given
from hypothesis import strategies as st
from typer.testing import CliRunner

from cgtool.commands.main import app
from cgtool.errors import InputError
from cgtool.traces.convert import FORMATS, load_trace
from cgtool.traces.trace import RequestTrace, read_trace


def assert_names_place(
    error: InputError, path: Path, line: int | None = None, field: str | None = None
) -> None:
    """The error is one sentence that starts with the file and names the line and field."""
    message = str(error)
    assert message.startswith(str(path)), message
    assert "\n" not in message
    if line is not None:
        assert re.search(rf", line {line}[:,]", message), message
    if field is not None:
        assert f"field '{field}'" in message, message


def assert_names_some_line_or_whole_file(error: InputError, path: Path, num_lines: int) -> None:
    assert_names_place(error, path)
    found = re.search(r", line (\d+)[:,]", str(error))
    if found:
        assert 1 <= int(found.group(1)) <= max(num_lines, 1)
    else:  # a whole-file error: nothing usable in it, or a gzip file that does not unpack
        assert "holds no" in str(error) or "is gzip-compressed but" in str(error), str(error)


# ---- values that are wrong for a field, whatever the rest of the record ------------------

NON_WHOLE = st.floats(allow_nan=True, allow_infinity=True).filter(
    lambda x: not math.isfinite(x) or not x.is_integer()
)
BAD_TOKENS = st.one_of(
    st.integers(max_value=-1),
    st.integers(min_value=2**31, max_value=10**30),
    NON_WHOLE,
    st.text(max_size=12),
    st.booleans(),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
BAD_SECONDS = st.one_of(
    st.floats(max_value=-1e-9),
    st.integers(max_value=-1),
    st.floats(min_value=1e10, allow_infinity=True),
    st.just(float("nan")),
    st.text(max_size=12),
    st.booleans(),
    st.lists(st.floats(), max_size=2),
)
REQUEST_FIELDS = {
    "arrival": BAD_SECONDS,
    "input_len": BAD_TOKENS,
    "output_len": BAD_TOKENS,
    "cached_len": BAD_TOKENS,
}


@st.composite
def request_records(draw, min_size: int = 1) -> list[dict]:
    records = []
    for _ in range(draw(st.integers(min_size, 8))):
        input_len = draw(st.integers(1, 200_000))
        record = {
            "arrival": draw(st.floats(0, 1e6) | st.integers(0, 10**6)),
            "input_len": input_len,
            "output_len": draw(st.integers(0, 10_000)),
        }
        if draw(st.booleans()):
            record["cached_len"] = draw(st.integers(0, input_len - 1))
        if draw(st.booleans()):
            # An unknown key is ignored; `mode` is not unknown: it makes the file a batch trace.
            extra = draw(st.text(min_size=1, max_size=6).filter(lambda k, record=record: k not in record and k != "mode"))
            record[extra] = draw(st.text(max_size=6))
        records.append(record)
    return records


def to_jsonl(records: list[dict]) -> str:
    return "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)


@fuzz(100)  # 100 generated files
@given(request_records())
def test_valid_request_files_read_back_exactly(records):
    path = fuzz_file(to_jsonl(records))
    trace = read_trace(path)
    assert isinstance(trace, RequestTrace)
    got = sorted(
        zip(
            trace.arrival_s.tolist(),
            trace.input_len.tolist(),
            trace.output_len.tolist(),
            trace.cached_len.tolist(),
        )
    )
    want = sorted(
        (float(r["arrival"]), r["input_len"], r["output_len"], r.get("cached_len", 0))
        for r in records
    )
    assert got == want


@fuzz(200)  # 200 generated files
@given(request_records(), st.data())
def test_one_bad_value_or_missing_field_names_its_line_and_field(records, data):
    line, field = spoil_one_record(records, data, REQUEST_FIELDS, optional="cached_len")
    path = fuzz_file(to_jsonl(records))
    try:
        read_trace(path)
    except InputError as error:
        assert_names_place(error, path, line + 1, field)
    else:
        raise AssertionError(f"accepted {records[line]!r}")


@fuzz(100)  # 100 generated files
@given(request_records(), st.data())
def test_a_truncated_line_names_that_line(records, data):
    text = to_jsonl(records).split("\n")[:-1]
    line = data.draw(st.integers(0, len(text) - 1))
    text[line] = text[line][: data.draw(st.integers(1, len(text[line]) - 1))]
    path = fuzz_file("\n".join(text) + "\n")
    try:
        read_trace(path)
    except InputError as error:
        assert_names_place(error, path, line + 1)
    else:
        raise AssertionError(f"accepted the truncated line {text[line]!r}")


@fuzz(200)  # 200 generated files per format, 6 formats: 1,200 parses
@given(
    st.one_of(
        st.binary(max_size=400),
        st.text(max_size=300).map(lambda t: t.encode("utf-8", "surrogatepass")),
    )
)
@example(b"\x1f\x8b")  # gzip's magic alone: read as gzip, it is cut short
def test_random_bytes_never_escape_as_anything_but_an_input_error(content):
    path = fuzz_file(content, "random.bin")
    num_lines = content.count(b"\n") + 1
    for trace_format in FORMATS:
        try:
            load_trace(path, trace_format)
        except InputError as error:
            assert_names_some_line_or_whole_file(error, path, num_lines)


@fuzz(50)  # 50 generated files
@given(request_records(), st.lists(st.sampled_from(["", " ", "\t", "\r"]), max_size=4))
def test_fast_and_line_by_line_readers_agree_on_valid_files(records, blanks):
    from cgtool.traces import trace as trace_module

    text = "".join(blank + "\n" for blank in blanks) + to_jsonl(records)
    path = fuzz_file(text)
    fast = read_trace(path)
    slow_lines = [
        (no, trace_module._record(t, path, no))
        for no, t in enumerate(text.split("\n"), 1)
        if t.strip()
    ]
    columns = list(zip(*(trace_module._request_row(rec, path, no) for no, rec in slow_lines)))
    slow = trace_module.request_trace(str(path), *columns)
    for column in ("arrival_s", "input_len", "output_len", "cached_len"):
        np.testing.assert_array_equal(getattr(fast, column), getattr(slow, column))


runner = CliRunner()


@fuzz(60)  # 60 generated files through the CLI
@given(
    st.one_of(
        st.binary(max_size=200),
        request_records().map(to_jsonl).map(str.encode),
        st.text(alphabet=string.printable + "é漢\u2028", max_size=200).map(str.encode),
    ),
    st.sampled_from(sorted(FORMATS)),
)
def test_cli_answers_exit_0_or_one_error_line_with_exit_2(content, trace_format):
    path = fuzz_file(content, "cli.input")
    result = runner.invoke(app, ["trace", "stats", str(path), "--format", trace_format])
    assert result.exit_code in (0, 2), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    if result.exit_code == 2:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {path}"), result.stderr
        assert "Traceback" not in result.output
