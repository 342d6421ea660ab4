"""cgtool's JSONL trace format: reading, writing, and the errors a bad line gives."""

from __future__ import annotations

import json

import numpy as np
import pytest
from text_files import write_lines

from cgtool.errors import InputError
from cgtool.traces import trace as trace_module
from cgtool.traces.trace import (
    BatchTrace,
    RequestTrace,
    batch_trace,
    read_trace,
    request_trace,
    write_trace,
)


def test_read_sorts_requests_by_arrival_and_defaults_cached_len_to_zero(tmp_path):
    path = write_lines(
        tmp_path,
        [
            '{"arrival": 2.5, "input_len": 30, "output_len": 3}',
            '{"arrival": 0.5, "input_len": 10, "output_len": 1, "cached_len": 4}',
            '{"arrival": 1.0, "input_len": 20, "output_len": 0, "cached_len": null, "user": "x"}',
        ],
    )
    trace = read_trace(path)
    assert isinstance(trace, RequestTrace)
    assert trace.arrival_s.tolist() == [0.5, 1.0, 2.5]
    assert trace.input_len.tolist() == [10, 20, 30]
    assert trace.output_len.tolist() == [1, 0, 3]
    assert trace.cached_len.tolist() == [4, 0, 0]


def test_equal_arrivals_keep_file_order(tmp_path):
    lines = [f'{{"arrival": 1, "input_len": {n}, "output_len": 1}}' for n in (5, 3, 9, 1)]
    assert read_trace(write_lines(tmp_path, lines)).input_len.tolist() == [5, 3, 9, 1]


def test_requests_round_trip_through_write_and_read(tmp_path):
    rng = np.random.default_rng(7)
    n = 500
    input_len = rng.integers(1, 9000, n)
    original = request_trace(
        "gen",
        np.sort(rng.uniform(0, 3600, n)).round(6),
        input_len,
        rng.integers(0, 2000, n),
        rng.integers(0, input_len),
    )
    path = tmp_path / "out.jsonl"
    write_trace(original, path)
    again = read_trace(path)
    assert isinstance(again, RequestTrace)
    np.testing.assert_array_equal(again.arrival_s, original.arrival_s)
    for column in ("input_len", "output_len", "cached_len"):
        np.testing.assert_array_equal(getattr(again, column), getattr(original, column))


def test_batches_round_trip_and_count_defaults_to_one(tmp_path):
    path = write_lines(
        tmp_path,
        [
            '{"mode": "decode", "batch_size": 37}',
            '{"mode": "extend", "num_tokens": 1904, "count": 3}',
            '{"mode": "decode", "batch_size": 8, "count": 40}',
        ],
    )
    trace = read_trace(path)
    assert isinstance(trace, BatchTrace)
    assert trace.decode_batch_size.tolist() == [37, 8]
    assert trace.decode_count.tolist() == [1, 40]
    assert trace.extend_num_tokens.tolist() == [1904]
    assert trace.extend_count.tolist() == [3]
    assert len(trace) == 44
    out = tmp_path / "again.jsonl"
    write_trace(trace, out)
    again = read_trace(out)
    assert again.decode_count.tolist() == [1, 40] and again.extend_count.tolist() == [3]
    assert '"count"' not in out.read_text().splitlines()[0]  # count 1 is left implicit


def test_whole_floats_crlf_bom_and_blank_lines_are_accepted(tmp_path):
    path = tmp_path / "t.jsonl"
    text = '\ufeff{"arrival": 0, "input_len": 812.0, "output_len": 2}\r\n\r\n   \n'
    text += '{"arrival": 1e-3, "input_len": 5, "output_len": 2.0}\r\n'
    path.write_text(text, encoding="utf-8")
    trace = read_trace(path)
    assert trace.input_len.tolist() == [812, 5]
    assert trace.arrival_s.tolist() == [0.0, 0.001]


def test_fast_reader_and_line_reader_agree(tmp_path, monkeypatch):
    lines = [
        json.dumps({"arrival": a, "input_len": i, "output_len": o, "cached_len": c})
        for a, i, o, c in [(3.25, 100, 5, 99), (0.0, 1, 0, 0), (1.5, 70, 9, 12)]
    ]
    path = write_lines(tmp_path, lines)
    fast = read_trace(path)
    monkeypatch.setattr(trace_module, "_read_valid_fast", lambda lines, source: None)
    slow = read_trace(path)
    for column in ("arrival_s", "input_len", "output_len", "cached_len"):
        np.testing.assert_array_equal(getattr(fast, column), getattr(slow, column))


BAD_REQUEST_LINES = [
    ('{"arrival": 0, "input_len": 5', "line 2: is not valid JSON"),
    ("[1, 2, 3]", "line 2: is not a JSON object"),
    ('{"arrival": 0, "output_len": 5}', "line 2, field 'input_len': is missing"),
    (
        '{"arrival": 0, "input_len": -3, "output_len": 5}',
        "line 2, field 'input_len': is -3, but must be at least 1",
    ),
    (
        '{"arrival": 0, "input_len": 0, "output_len": 5}',
        "field 'input_len': is 0, but must be at least 1",
    ),
    ('{"arrival": 0, "input_len": 4, "output_len": -1}', "line 2, field 'output_len': is -1"),
    ('{"arrival": -0.5, "input_len": 4, "output_len": 1}', "line 2, field 'arrival': is -0.5"),
    (
        '{"arrival": NaN, "input_len": 4, "output_len": 1}',
        "field 'arrival': is nan, not a finite time",
    ),
    (
        '{"arrival": 0, "input_len": "812", "output_len": 1}',
        "field 'input_len': is '812', not a number",
    ),
    (
        '{"arrival": 0, "input_len": true, "output_len": 1}',
        "field 'input_len': is True, not a number",
    ),
    (
        '{"arrival": 0, "input_len": 8.5, "output_len": 1}',
        "field 'input_len': is 8.5, not a whole number",
    ),
    (
        '{"arrival": 0, "input_len": 1e300, "output_len": 1}',
        "field 'input_len': is 1e+300, larger than",
    ),
    (
        '{"arrival": 0, "input_len": 99999999999999999999, "output_len": 1}',
        "field 'input_len': is 99999999999999999999, larger than",
    ),
    (
        '{"arrival": "soon", "input_len": 4, "output_len": 1}',
        "field 'arrival': is 'soon', not a number",
    ),
    (
        '{"arrival": 0, "input_len": 4, "output_len": 1, "cached_len": 4}',
        "field 'cached_len': is 4, but must be less than input_len (4)",
    ),
    (
        '{"arrival": 0, "input_len": 4, "output_len": 1, "cached_len": -1}',
        "field 'cached_len': is -1",
    ),
]


@pytest.mark.parametrize("bad_line, expected", BAD_REQUEST_LINES)
def test_bad_request_line_names_file_line_and_field(tmp_path, bad_line, expected):
    path = write_lines(tmp_path, ['{"arrival": 0, "input_len": 5, "output_len": 1}', bad_line])
    with pytest.raises(InputError) as caught:
        read_trace(path)
    message = str(caught.value)
    assert message.startswith(f"{path}, line 2")
    assert expected in message
    assert "docs/traces.md" in message  # the remedy says where the format is described
    assert "\n" not in message


BAD_BATCH_LINES = [
    ('{"mode": "prefill", "num_tokens": 5}', "line 2, field 'mode': is \"prefill\""),
    ('{"arrival": 0, "input_len": 5, "output_len": 1}', "line 2, field 'mode': is missing"),
    ('{"mode": "decode", "num_tokens": 5}', "line 2, field 'batch_size': is missing"),
    (
        '{"mode": "extend", "num_tokens": 0}',
        "line 2, field 'num_tokens': is 0, but must be at least 1",
    ),
    ('{"mode": "decode", "batch_size": 4, "count": 0}', "line 2, field 'count': is 0"),
]


@pytest.mark.parametrize("bad_line, expected", BAD_BATCH_LINES)
def test_bad_batch_line_names_file_line_and_field(tmp_path, bad_line, expected):
    path = write_lines(tmp_path, ['{"mode": "decode", "batch_size": 3}', bad_line])
    with pytest.raises(InputError) as caught:
        read_trace(path)
    assert expected in str(caught.value)


def test_file_without_records_is_an_input_error(tmp_path):
    path = write_lines(tmp_path, ["", "   "])
    with pytest.raises(InputError, match="holds no records"):
        read_trace(path)


def test_bytes_that_are_not_utf8_name_their_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"arrival": 0, "input_len": 5, "output_len": 1}\n{"arrival": \xff}\n')
    with pytest.raises(InputError, match=r"line 2: is not UTF-8 text"):
        read_trace(path)


def test_missing_file_and_folder_are_input_errors(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        read_trace(tmp_path / "absent.jsonl")
    with pytest.raises(InputError, match="is a folder"):
        read_trace(tmp_path)


def test_write_replaces_the_file_whole(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("old contents that are longer than the new ones\n" * 50)
    write_trace(batch_trace("x", [("extend", 7, 1)]), path)
    assert path.read_text() == '{"mode": "extend", "num_tokens": 7}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["t.jsonl"]  # no temp file left behind


def test_a_gzipped_trace_reads_as_its_text(tmp_path):
    # Public traces ship gzipped; reading one answered "is not UTF-8 text".
    import gzip

    lines = ['{"arrival": 0.5, "input_len": 10, "output_len": 1}', '{"arrival": 1, "input_len": 7, "output_len": 2}']
    plain, packed = tmp_path / "t.jsonl", tmp_path / "t.jsonl.gz"
    plain.write_text("\n".join(lines) + "\n")
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert np.array_equal(read_trace(packed).input_len, read_trace(plain).input_len)
    assert list(read_trace(packed).input_len) == [10, 7]


def test_a_cut_gzip_is_one_error_saying_so(tmp_path):
    import gzip

    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"arrival": 0.5, "input_len": 10, "output_len": 1}\n' * 200)[:40])
    with pytest.raises(InputError, match="is gzip-compressed but cut short or damaged"):
        read_trace(path)
