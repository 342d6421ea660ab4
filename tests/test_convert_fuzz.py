"""Fuzzing the converters (issue 7): valid files convert exactly; one bad cell, value or line
gives an InputError naming file, line and field; noise in server logs is ignored.

Generated cases per run, stated on each test: 100 + 150 + 100 + 150 + 100 + 150 + 100 + 100 + 100
= 1,050 files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fuzzing import fuzz, fuzz_file, spoil_one_cell, spoil_one_record
from hypothesis import given
from hypothesis import strategies as st

from cgtool.errors import InputError
from cgtool.traces.convert_logs import convert_sglang_log, convert_vllm_metrics
from cgtool.traces.convert_public import convert_azure, convert_burstgpt, convert_mooncake


def expect_error(convert, path: Path, line: int, field: str | None) -> None:
    try:
        convert(path)
    except InputError as error:
        message = str(error)
        assert message.startswith(f"{path}, line {line}") and "\n" not in message, message
        if field is not None:
            assert f"field '{field}'" in message, message
    else:
        raise AssertionError(f"line {line} of {path.read_text()!r} was accepted")


# CSV cells that no token count can be: no commas, quotes or line ends, so the row keeps its shape.
LETTERS = st.text(alphabet=st.characters(categories=["L"]), min_size=1, max_size=8)
BAD_COUNT_CELL = st.one_of(
    st.integers(max_value=-1).map(str),
    st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: not x.is_integer()).map(repr),
    st.integers(10**19, 10**40).map(str),
    LETTERS,
    st.just(""),
)
BAD_SECONDS_CELL = st.one_of(
    st.floats(max_value=-1e-6, allow_infinity=False).map(repr),
    st.floats(min_value=1e10, allow_infinity=False).map(repr),
    LETTERS,
    st.just(""),
)


# ---- Azure ---------------------------------------------------------------------------


@st.composite
def azure_rows(draw) -> list[list[str]]:
    rows = []
    for _ in range(draw(st.integers(1, 8))):
        seconds = draw(st.integers(0, 86399))
        stamp = f"2023-11-16 {seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}.{draw(st.integers(0, 9999999)):07d}"
        rows.append([stamp, str(draw(st.integers(1, 200_000))), str(draw(st.integers(0, 5000)))])
    return rows


def azure_text(rows: list[list[str]]) -> str:
    return "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(",".join(row) for row in rows)


@fuzz(100)  # 100 generated files
@given(azure_rows())
def test_valid_azure_files_convert_every_row(rows):
    trace = convert_azure(fuzz_file(azure_text(rows), "azure.csv")).trace
    assert sorted(trace.input_len.tolist()) == sorted(int(row[1]) for row in rows)
    assert trace.arrival_s[0] == 0 and (trace.arrival_s[1:] >= trace.arrival_s[:-1]).all()


AZURE_BAD = {
    0: (
        "TIMESTAMP",
        st.one_of(
            LETTERS, st.just(""), st.just("2023-13-45 10:00:00"), st.just("2023-11-16 24:00:00")
        ),
    ),
    1: ("ContextTokens", BAD_COUNT_CELL),
    2: ("GeneratedTokens", BAD_COUNT_CELL),
}


@fuzz(150)  # 150 generated files
@given(azure_rows(), st.data())
def test_one_bad_azure_cell_names_its_line_and_column(rows, data):
    index, name = spoil_one_cell(rows, data, AZURE_BAD)
    expect_error(convert_azure, fuzz_file(azure_text(rows), "azure.csv"), index + 2, name)


@fuzz(100)  # 100 generated files
@given(azure_rows(), st.data())
def test_an_azure_row_cut_short_names_its_line(rows, data):
    index = data.draw(st.integers(0, len(rows) - 1))
    rows[index] = rows[index][: data.draw(st.integers(1, 2))]
    expect_error(convert_azure, fuzz_file(azure_text(rows), "azure.csv"), index + 2, None)


# ---- BurstGPT ------------------------------------------------------------------------

BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"


@st.composite
def burst_rows(draw) -> list[list[str]]:
    rows = []
    for _ in range(draw(st.integers(1, 8))):
        prompt, output = draw(st.integers(1, 50_000)), draw(st.integers(1, 4000))
        stamp = draw(st.integers(0, 10**7).map(str) | st.floats(0, 1e7).map(repr))
        model = draw(st.sampled_from(["ChatGPT", "GPT-4", "模型"]))
        rows.append(
            [stamp, model, str(prompt), str(output), str(prompt + output), "Conversation log"]
        )
    return rows


def burst_text(rows: list[list[str]]) -> str:
    return BURST_HEADER + "\n" + "".join(",".join(row) + "\n" for row in rows)


BURST_BAD = {
    0: ("Timestamp", BAD_SECONDS_CELL),
    2: ("Request tokens", BAD_COUNT_CELL),
    3: ("Response tokens", BAD_COUNT_CELL),
}


@fuzz(150)  # 150 generated files
@given(burst_rows(), st.data())
def test_one_bad_burstgpt_cell_names_its_line_and_column(rows, data):
    index, name = spoil_one_cell(rows, data, BURST_BAD)
    expect_error(
        convert_burstgpt, fuzz_file(burst_text(rows), "burst.csv"), index + 2, name
    )


# ---- Mooncake ------------------------------------------------------------------------


@st.composite
def mooncake_records(draw) -> list[dict]:
    return [
        {
            "timestamp": draw(st.integers(0, 4_000_000)),
            "input_length": draw(st.integers(1, 130_000)),
            "output_length": draw(st.integers(0, 2000)),
            "hash_ids": draw(st.lists(st.integers(0, 30), max_size=6)),
        }
        for _ in range(draw(st.integers(1, 8)))
    ]


def jsonl(records: list[dict]) -> str:
    return "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)


@fuzz(100)  # 100 generated files
@given(mooncake_records())
def test_valid_mooncake_files_keep_cached_below_the_prompt(records):
    trace = convert_mooncake(fuzz_file(jsonl(records), "mooncake.jsonl")).trace
    assert len(trace) == len(records)
    assert (trace.cached_len < trace.input_len).all()
    assert ((trace.cached_len % 512 == 0) | (trace.cached_len == trace.input_len - 1)).all()


MOONCAKE_BAD = {
    "timestamp": st.one_of(
        st.integers(max_value=-1), st.floats(min_value=1e13), st.text(max_size=5), st.booleans()
    ),
    "input_length": st.one_of(
        st.integers(max_value=-1),
        st.integers(min_value=2**31),
        st.text(max_size=5),
        st.booleans(),
        st.just(2.5),
    ),
    "output_length": st.one_of(
        st.integers(max_value=-1), st.text(max_size=5), st.lists(st.integers(), max_size=2)
    ),
    "hash_ids": st.one_of(
        st.text(max_size=5),
        st.integers(),
        st.lists(st.text(max_size=3), min_size=1, max_size=3),
        st.just([1, 2.0]),
        st.just([True]),
    ),
}


@fuzz(150)  # 150 generated files
@given(mooncake_records(), st.data())
def test_one_bad_mooncake_value_names_its_line_and_field(records, data):
    index, field = spoil_one_record(records, data, MOONCAKE_BAD, optional="hash_ids")
    expect_error(convert_mooncake, fuzz_file(jsonl(records), "mooncake.jsonl"), index + 1, field)


# ---- SGLang and vLLM logs -------------------------------------------------------------

NOISE = st.text(max_size=60).filter(
    lambda t: "\n" not in t and "\r" not in t and "batch" not in t.lower() and "|" not in t
)


@st.composite
def sglang_lines(draw) -> tuple[list[str], list[tuple[str, int]]]:
    lines, expected = [], []
    for _ in range(draw(st.integers(1, 10))):
        if draw(st.booleans()):
            lines.append(draw(NOISE))
            continue
        size = draw(st.integers(1, 100_000))
        sep = draw(st.sampled_from([".", ",", " [17],"]))
        if draw(st.booleans()):
            lines.append(
                f"[t TP0] Prefill batch{sep} #new-seq: 1, #new-token: {size}, #cached-token: 3, token usage: 0.1,"
            )
            expected.append(("extend", size))
        else:
            lines.append(
                f"[t] Decode batch{sep} #running-req: {size}, #token: 9, cuda graph: True,"
            )
            expected.append(("decode", size))
    return lines, expected


@fuzz(100)  # 100 generated logs
@given(sglang_lines())
def test_sglang_batch_lines_are_found_among_any_noise(log):
    lines, expected = log
    path = fuzz_file("\n".join(lines) + "\n", "server.log")
    if not expected:
        with pytest.raises(InputError, match="holds no 'Prefill batch'"):
            convert_sglang_log(path)
        return
    trace = convert_sglang_log(path).trace
    assert trace.extend_num_tokens.tolist() == [size for kind, size in expected if kind == "extend"]
    assert trace.decode_batch_size.tolist() == [size for kind, size in expected if kind == "decode"]


VLLM_HEADER = "| Unpadded Tokens | Padded Tokens | Num Paddings | Runtime Mode | Count |\n|---|---|---|---|---|\n"


@st.composite
def vllm_rows(draw) -> list[list[str]]:
    return [
        [
            str(draw(st.integers(1, 8192))),
            "0",
            "0",
            draw(st.sampled_from(["FULL", "PIECEWISE", "NONE"])),
            str(draw(st.integers(1, 10**6))),
        ]
        for _ in range(draw(st.integers(1, 8)))
    ]


def vllm_text(rows: list[list[str]]) -> str:
    return VLLM_HEADER + "".join("| " + " | ".join(row) + " |\n" for row in rows)


@fuzz(100)  # 100 generated logs
@given(vllm_rows())
def test_valid_vllm_tables_keep_every_step(rows):
    trace = convert_vllm_metrics(fuzz_file(vllm_text(rows), "vllm.log")).trace
    assert len(trace) == sum(int(row[4]) for row in rows)
    assert sorted(trace.decode_batch_size.tolist()) == sorted(
        int(r[0]) for r in rows if r[3] == "FULL"
    )


VLLM_BAD = {
    0: ("Unpadded Tokens", BAD_COUNT_CELL),
    3: ("Runtime Mode", LETTERS.filter(lambda t: t not in ("FULL", "PIECEWISE", "NONE"))),
    4: ("Count", BAD_COUNT_CELL),
}


@fuzz(100)  # 100 generated logs
@given(vllm_rows(), st.data())
def test_one_bad_vllm_cell_names_its_line_and_column(rows, data):
    index, name = spoil_one_cell(rows, data, VLLM_BAD)
    expect_error(
        convert_vllm_metrics, fuzz_file(vllm_text(rows), "vllm.log"), index + 3, name
    )
