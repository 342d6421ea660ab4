"""Batch traces from server logs: SGLang scheduler lines and vLLM --cudagraph-metrics tables."""

from __future__ import annotations

import pytest
from text_files import write_text as write

from cgtool.errors import InputError
from cgtool.traces.convert_logs import convert_sglang_log, convert_vllm_metrics

# Line shapes as SGLang releases print them: "Prefill batch." (older), "Prefill batch,"
# (newer), "Prefill batch [n]," (SGLANG_LOG_FORWARD_ITERS), with TP/DP prefixes.
SGLANG_LOG = """\
[2025-09-03 05:49:00] INFO:     Started server process [4242]
[2025-09-03 05:49:04] Prefill batch. #new-seq: 1, #new-token: 115, #cached-token: 351, token usage: 0.02, #running-req: 0, #queue-req: 0,
[2025-09-03 05:49:04] Decode batch. #running-req: 1, #token: 501, token usage: 0.02, cuda graph: True, gen throughput (token/s): 65.75, #queue-req: 0,
[2025-09-03 05:49:05 TP0] Prefill batch, #new-seq: 3, #new-token: 2048, #cached-token: 0, full token usage: 0.10, swa token usage: 0.05, #running-req: 1, #queue-req: 2,
[2025-09-03 05:49:05 DP1 TP1] Decode batch, #running-req: 4, #token: 16384, token usage: 0.71, cuda graph: True, gen throughput (token/s): 2520.18, #queue-req: 3,
[2025-09-03 05:49:06] Decode batch [124], #running-req: 18, #token: 16384, token usage: 0.71, cuda graph: False, gen throughput (token/s): 2520.18, #queue-req: 3
[2025-09-03 05:49:06] Prefill batch [125], #new-seq: 2, #new-token: 900, #cached-token: 128, token usage: 0.72, #running-req: 18, #queue-req: 0,
[2025-09-03 05:49:07] INFO:     127.0.0.1:54504 - "POST /v1/chat/completions HTTP/1.1" 200 OK
"""


def test_sglang_log_gives_extend_tokens_and_decode_sizes(tmp_path):
    result = convert_sglang_log(write(tmp_path, "server.log", SGLANG_LOG))
    trace = result.trace
    assert result.records_read == 6
    assert trace.extend_num_tokens.tolist() == [115, 2048, 900]  # computed tokens, cache excluded
    assert trace.extend_count.tolist() == [1, 1, 1]
    assert trace.decode_batch_size.tolist() == [1, 4, 18]
    # one decode line is logged every --decode-log-interval (40) decode steps
    assert trace.decode_count.tolist() == [40, 40, 40]


def test_sglang_decode_log_interval_is_an_option(tmp_path):
    trace = convert_sglang_log(
        write(tmp_path, "server.log", SGLANG_LOG), decode_log_interval=10
    ).trace
    assert trace.decode_count.tolist() == [10, 10, 10]
    assert len(trace) == 3 + 30


def test_sglang_log_without_batch_lines_says_which_lines_it_needs(tmp_path):
    path = write(tmp_path, "server.log", "[2025-09-03] INFO: Application startup complete.\n")
    with pytest.raises(InputError) as caught:
        convert_sglang_log(path)
    assert str(path) in str(caught.value)
    assert "Prefill batch" in str(caught.value) and "--log-level info" in str(caught.value)


def test_sglang_absurd_count_names_line_and_field(tmp_path):
    line = "[x] Decode batch. #running-req: 123456789012345678901234, #token: 1\n"
    with pytest.raises(InputError, match=r"line 2, field '#running-req': is '1234"):
        convert_sglang_log(write(tmp_path, "server.log", SGLANG_LOG.splitlines()[1] + "\n" + line))


def test_sglang_zero_token_prefill_is_left_out(tmp_path):
    text = (
        SGLANG_LOG
        + "[x] Prefill batch. #new-seq: 0, #new-token: 0, #cached-token: 0, token usage: 0.0,\n"
    )
    result = convert_sglang_log(write(tmp_path, "server.log", text))
    assert result.skipped == {"empty batch (0 tokens)": 1}
    assert result.trace.extend_num_tokens.tolist() == [115, 2048, 900]


# vLLM's CUDAGraphLogging.generate_metric_table, logged through logger.info: the first line
# carries the log prefix; engine-core output may prefix every line.
VLLM_LOG = """\
(APIServer pid=11) INFO 11-22 10:00:00 [loggers.py:123] Engine 000: Avg prompt throughput: 512.0 tokens/s
(EngineCore_DP0 pid=12) INFO 11-22 10:00:00 [cuda_graph.py:89] **CUDAGraph Config Settings:**
(EngineCore_DP0 pid=12) 
(EngineCore_DP0 pid=12) - Mode: FULL_AND_PIECEWISE
(EngineCore_DP0 pid=12) - Capture sizes: [1, 2, 4, 8, 16, 24, 32]
(EngineCore_DP0 pid=12) 
(EngineCore_DP0 pid=12) **CUDAGraph Stats:**
(EngineCore_DP0 pid=12) 
(EngineCore_DP0 pid=12) | Unpadded Tokens | Padded Tokens | Num Paddings | Runtime Mode | Count |
(EngineCore_DP0 pid=12) |-----------------|---------------|--------------|--------------|-------|
(EngineCore_DP0 pid=12) | 7               | 8             | 1            | FULL         | 120   |
(EngineCore_DP0 pid=12) | 30              | 32            | 2            | PIECEWISE    | 4     |
(EngineCore_DP0 pid=12) | 812             | 812           | 0            | NONE         | 2     |
(APIServer pid=11) INFO 11-22 10:00:10 [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s
INFO 11-22 10:00:10 [cuda_graph.py:89] **CUDAGraph Config Settings:**

- Mode: FULL_AND_PIECEWISE
- Capture sizes: [1, 2, 4, 8, 16, 24, 32]

**CUDAGraph Stats:**

| Unpadded Tokens | Padded Tokens | Num Paddings | Runtime Mode | Count |
|-----------------|---------------|--------------|--------------|-------|
| 7               | 8             | 1            | FULL         | 80    |
| 16              | 16            | 0            | FULL         | 3     |
"""


def test_vllm_tables_give_decode_for_full_rows_and_extend_for_the_rest(tmp_path):
    result = convert_vllm_metrics(write(tmp_path, "vllm.log", VLLM_LOG))
    trace = result.trace
    assert result.records_read == 5
    assert trace.decode_batch_size.tolist() == [7, 7, 16]
    assert trace.decode_count.tolist() == [120, 80, 3]
    assert trace.extend_num_tokens.tolist() == [30, 812]
    assert trace.extend_count.tolist() == [4, 2]


def test_vllm_piecewise_only_mode_counts_every_row_as_tokens(tmp_path):
    text = VLLM_LOG.replace("Mode: FULL_AND_PIECEWISE", "Mode: PIECEWISE").replace(
        "FULL         |", "PIECEWISE    |"
    )
    trace = convert_vllm_metrics(write(tmp_path, "vllm.log", text)).trace
    assert trace.decode_batch_size.tolist() == []
    assert sorted(trace.extend_num_tokens.tolist()) == [7, 7, 16, 30, 812]


def test_vllm_columns_are_read_by_header_name(tmp_path):
    text = "| Count | Runtime Mode | Unpadded Tokens |\n|---|---|---|\n| 5 | FULL | 3 |\n"
    trace = convert_vllm_metrics(write(tmp_path, "vllm.log", text)).trace
    assert trace.decode_batch_size.tolist() == [3] and trace.decode_count.tolist() == [5]


@pytest.mark.parametrize(
    "row, expected",
    [
        ("| 7 | 8 | 1 | GRAPHY | 3 |", "line 3, field 'Runtime Mode': is 'GRAPHY'"),
        (
            "| seven | 8 | 1 | FULL | 3 |",
            "line 3, field 'Unpadded Tokens': is 'seven', not a number",
        ),
        ("| 7 | 8 | 1 | FULL | 0 |", "line 3, field 'Count': is 0, but must be at least 1"),
        ("| 7 | 8 | 1 |", "line 3: has 3 table cells"),
    ],
)
def test_vllm_bad_row_names_line_and_field(tmp_path, row, expected):
    text = "| Unpadded Tokens | Padded Tokens | Num Paddings | Runtime Mode | Count |\n|---|---|---|---|---|\n"
    with pytest.raises(InputError) as caught:
        convert_vllm_metrics(write(tmp_path, "vllm.log", text + row + "\n"))
    assert expected in str(caught.value)


def test_vllm_log_without_tables_says_how_to_get_them(tmp_path):
    with pytest.raises(InputError, match="--cudagraph-metrics"):
        convert_vllm_metrics(write(tmp_path, "vllm.log", "INFO started | ok\n"))
