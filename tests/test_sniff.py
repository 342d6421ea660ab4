"""Guessing a public trace format from a file's first lines, for the `--format` hint."""

import pytest

from cgtool.traces.sniff import guess_format


@pytest.mark.parametrize(("first_line", "expected"), [
    ("TIMESTAMP,ContextTokens,GeneratedTokens", "azure"),
    ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type", "burstgpt"),
    ('{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0]}', "mooncake"),
    ("[2026-01-01 10:00:00] Prefill batch. #new-seq: 1, #new-token: 512", "sglang-log"),
    ('{"arrival": 0.5, "input_len": 10, "output_len": 5}', None),
    ("nothing to recognise", None),
])
def test_guess_format_names_the_format_of_the_first_lines(tmp_path, first_line, expected):
    path = tmp_path / "trace"
    path.write_text(first_line + "\n")
    assert guess_format(path) == expected


def test_guess_format_of_a_missing_file_is_none(tmp_path):
    assert guess_format(tmp_path / "absent") is None


def test_guess_format_reads_through_gzip(tmp_path):
    import gzip

    path = tmp_path / "azure.csv.gz"
    path.write_bytes(gzip.compress(b"TIMESTAMP,ContextTokens,GeneratedTokens\n"))
    assert guess_format(path) == "azure"
