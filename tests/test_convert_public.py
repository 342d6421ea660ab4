"""Azure, BurstGPT and Mooncake converters: small hand-checked fixtures and the real files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from text_files import write_text as write

from cgtool.errors import InputError
from cgtool.traces.convert_public import convert_azure, convert_burstgpt, convert_mooncake
from cgtool.traces.stats import request_stats

REAL_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
AZURE_REAL = REAL_TRACES / "AzureLLMInferenceTrace_conv.csv"
MOONCAKE_REAL = REAL_TRACES / "mooncake_fast25_conversation_trace.jsonl"
needs_real = pytest.mark.skipif(not REAL_TRACES.is_dir(), reason="../shared/traces is not here")


# ---- Azure ---------------------------------------------------------------------------

AZURE_SMALL = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:46.1805900,1020,0
2023-11-16 23:59:59.5000000,5,5
2023-11-17 00:00:00.2500000,0,12
2023-11-17 00:00:01.0000000,7,1"""  # no trailing newline, as the real file


def test_azure_arrivals_are_seconds_from_the_earliest_row(tmp_path):
    result = convert_azure(write(tmp_path, "a.csv", AZURE_SMALL))
    trace = result.trace
    assert result.records_read == 6
    assert result.skipped == {"empty prompt (0 tokens)": 1}
    # sorted by time: the third row came first; the trace crosses midnight
    assert trace.input_len.tolist() == [1020, 374, 396, 5, 7]
    assert trace.output_len.tolist() == [0, 44, 109, 5, 1]
    expected = [0.0, 0.5, 4.814579, 20653.3194100, 20654.8194100]
    np.testing.assert_allclose(trace.arrival_s, expected, atol=1e-6)
    assert trace.cached_len.tolist() == [0] * 5


def test_azure_time_zones_are_applied(tmp_path):
    text = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    text += "2024-05-10 00:00:00.000000+00:00,10,1\n2024-05-10 02:00:30.000000+02:00,10,1\n"
    trace = convert_azure(write(tmp_path, "a.csv", text)).trace
    assert trace.arrival_s.tolist() == [0.0, 30.0]


def test_azure_columns_are_found_by_name(tmp_path):
    text = "GeneratedTokens,TIMESTAMP,ContextTokens\n3,2023-11-16 18:15:46.0,9\n"
    trace = convert_azure(write(tmp_path, "a.csv", text)).trace
    assert trace.input_len.tolist() == [9] and trace.output_len.tolist() == [3]


@pytest.mark.parametrize(
    "row, expected",
    [
        ("2023-11-16 18:15:46.6805900,374", "line 3: has 2 columns"),
        ("yesterday,374,44", "line 3, field 'TIMESTAMP': is 'yesterday', not a time"),
        ("2023-02-30 18:15:46.6,374,44", "line 3, field 'TIMESTAMP': has the impossible date"),
        ("2023-11-16 25:15:46.6,374,44", "line 3, field 'TIMESTAMP': has the impossible time"),
        ("2023-11-16 18:15:46.6,-374,44", "line 3, field 'ContextTokens': is -374"),
        (
            "2023-11-16 18:15:46.6,374,lots",
            "line 3, field 'GeneratedTokens': is 'lots', not a number",
        ),
        ("2023-11-16 18:15:46.6,374,", "line 3, field 'GeneratedTokens': is empty"),
        (
            "2023-11-16 18:15:46.6,37.5,4",
            "line 3, field 'ContextTokens': is '37.5', not a whole number",
        ),
    ],
)
def test_azure_bad_row_names_line_and_field(tmp_path, row, expected):
    text = f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0,1,1\n{row}\n"
    path = write(tmp_path, "a.csv", text)
    with pytest.raises(InputError) as caught:
        convert_azure(path)
    assert str(caught.value).startswith(str(path))
    assert expected in str(caught.value)


def test_azure_header_without_a_column_names_it(tmp_path):
    path = write(tmp_path, "a.csv", "TIMESTAMP,Context\n2023-11-16 18:15:46.0,1\n")
    with pytest.raises(
        InputError, match=r"line 1, field 'ContextTokens': is missing from the header"
    ):
        convert_azure(path)


@needs_real
def test_azure_real_conversation_trace():
    result = convert_azure(AZURE_REAL)
    stats = request_stats(result.trace)
    # Figures from ../shared/traces/README.md: 19,366 requests over ≈58 min.
    assert result.records_read == 19366 and result.skipped == {}
    assert stats.num_requests == 19366
    assert 57 * 60 < stats.duration_s < 59 * 60
    assert stats.input_len.p[50] == 1020 and stats.input_len.max == 14050
    assert stats.output_len.p[50] == 129 and stats.output_len.max == 1000
    assert np.all(np.diff(result.trace.arrival_s) >= 0)


# ---- BurstGPT ------------------------------------------------------------------------

BURSTGPT_SMALL = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5270414,ChatGPT,472,18,490,Conversation log
5270418,GPT-4,1087,230,1317,Conversation log
5270420,ChatGPT,300,0,300,API log
5270421,ChatGPT,0,20,20,Conversation log
5270425.5,GPT-4,417,276,693,API log
"""


def test_burstgpt_keeps_served_requests_relative_to_the_first(tmp_path):
    result = convert_burstgpt(write(tmp_path, "b.csv", BURSTGPT_SMALL))
    assert result.records_read == 5
    assert result.skipped == {"failed request (0 response tokens)": 1, "empty prompt (0 tokens)": 1}
    assert result.trace.arrival_s.tolist() == [0.0, 4.0, 11.5]
    assert result.trace.input_len.tolist() == [472, 1087, 417]
    assert result.trace.output_len.tolist() == [18, 230, 276]


def test_burstgpt_release_3_columns_with_session_ids_read_too(tmp_path):
    text = "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    text += "0,ab-12,1.5,ChatGPT,100,20,120,Conversation log\n2,ab-12,0.9,ChatGPT,180,30,210,Conversation log\n"
    trace = convert_burstgpt(write(tmp_path, "b.csv", text)).trace
    assert trace.input_len.tolist() == [100, 180] and trace.arrival_s.tolist() == [0.0, 2.0]


@pytest.mark.parametrize(
    "row, expected",
    [
        ("-4,ChatGPT,10,10,20,API log", "field 'Timestamp': is -4.0, but must be zero or more"),
        ("inf,ChatGPT,10,10,20,API log", "field 'Timestamp': is 'inf', not a finite number"),
        ("4,ChatGPT,ten,10,20,API log", "field 'Request tokens': is 'ten', not a number"),
        ("4,ChatGPT,10,-10,0,API log", "field 'Response tokens': is -10"),
        ('4,ChatGPT,"10', "line 3: has 3 columns"),
    ],
)
def test_burstgpt_bad_row_names_line_and_field(tmp_path, row, expected):
    text = BURSTGPT_SMALL.splitlines()[0] + "\n1,ChatGPT,1,1,2,API log\n" + row + "\n"
    with pytest.raises(InputError) as caught:
        convert_burstgpt(write(tmp_path, "b.csv", text))
    assert "line 3" in str(caught.value) and expected in str(caught.value)


def test_burstgpt_with_only_failures_is_an_error(tmp_path):
    text = BURSTGPT_SMALL.splitlines()[0] + "\n1,ChatGPT,10,0,10,API log\n"
    with pytest.raises(InputError, match="holds no usable request"):
        convert_burstgpt(write(tmp_path, "b.csv", text))


# ---- Mooncake ------------------------------------------------------------------------

MOONCAKE_SMALL = """\
{"timestamp": 0, "input_length": 1200, "output_length": 10, "hash_ids": [1, 2, 3]}
{"timestamp": 500, "input_length": 1100, "output_length": 20, "hash_ids": [1, 2, 4]}
{"timestamp": 250, "input_length": 600, "output_length": 5, "hash_ids": [1, 9]}
{"timestamp": 900, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]}
{"timestamp": 1000, "input_length": 700, "output_length": 0, "hash_ids": [7, 1]}
{"timestamp": 2000, "input_length": 300, "output_length": 3}
"""


def test_mooncake_cached_prefix_is_the_leading_blocks_already_seen(tmp_path):
    trace = convert_mooncake(write(tmp_path, "m.jsonl", MOONCAKE_SMALL)).trace
    assert trace.arrival_s.tolist() == [0.0, 0.25, 0.5, 0.9, 1.0, 2.0]
    assert trace.input_len.tolist() == [1200, 600, 1100, 1024, 700, 300]
    # [1,2,3] new; [1,9] shares block 1; [1,2,4] shares 1,2; [1,2] all seen but the last
    # token is always computed; [7,1] starts with an unseen block; no hash_ids: nothing cached.
    assert trace.cached_len.tolist() == [0, 512, 1024, 1023, 0, 0]


def test_mooncake_block_size_is_an_option(tmp_path):
    trace = convert_mooncake(write(tmp_path, "m.jsonl", MOONCAKE_SMALL), block_tokens=256).trace
    assert trace.cached_len.tolist() == [0, 256, 512, 512, 0, 0]


@pytest.mark.parametrize(
    "line, expected",
    [
        (
            '{"timestamp": 10, "input_length": 5, "output_length": 1, "hash_ids": [1, "a"]}',
            "field 'hash_ids'",
        ),
        (
            '{"timestamp": 10, "input_length": 5, "output_length": 1, "hash_ids": 3}',
            "field 'hash_ids'",
        ),
        ('{"timestamp": -10, "input_length": 5, "output_length": 1}', "field 'timestamp': is -10"),
        ('{"timestamp": 10, "output_length": 1}', "field 'input_length': is missing"),
        (
            '{"timestamp": 10, "input_length": 5, "output_length": "x"}',
            "field 'output_length': is 'x'",
        ),
        ('{"timestamp": 10, "input_length": 5,', "line 2: is not valid JSON"),
    ],
)
def test_mooncake_bad_line_names_line_and_field(tmp_path, line, expected):
    text = '{"timestamp": 0, "input_length": 5, "output_length": 1}\n' + line + "\n"
    with pytest.raises(InputError) as caught:
        convert_mooncake(write(tmp_path, "m.jsonl", text))
    assert "line 2" in str(caught.value) and expected in str(caught.value)


@needs_real
def test_mooncake_real_conversation_trace():
    result = convert_mooncake(MOONCAKE_REAL)
    stats = request_stats(result.trace)
    # ../shared/traces/README.md: 12,031 requests, prompts median 6,909 / max 126,195,
    # outputs median 350 / max 2,000, about 37% of prompt tokens a prefix already seen.
    assert stats.num_requests == 12031
    assert stats.input_len.p[50] == 6909 and stats.input_len.max == 126195
    assert stats.output_len.p[50] == 350 and stats.output_len.max == 2000
    assert 0.36 < stats.cached_share < 0.38
    assert 58 * 60 < stats.duration_s < 60 * 60
    assert np.all(result.trace.cached_len < result.trace.input_len)


def test_a_file_that_is_no_text_names_the_format_with_its_article(tmp_path):
    path = tmp_path / "a.csv"
    path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InputError, match="Is this really an Azure trace"):
        convert_azure(path)
    with pytest.raises(InputError, match="Is this really a BurstGPT trace"):
        convert_burstgpt(path)
