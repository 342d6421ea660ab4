"""Every trace format cgtool reads, by name, and one entry point to read any of them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from cgtool.errors import InputError
from cgtool.traces.convert_logs import (
    SGLANG_DECODE_LOG_INTERVAL,
    convert_sglang_log,
    convert_vllm_metrics,
)
from cgtool.traces.convert_public import (
    MOONCAKE_BLOCK_TOKENS,
    convert_azure,
    convert_burstgpt,
    convert_mooncake,
)
from cgtool.traces.trace import ConvertResult, RequestTrace, read_trace

FORMATS: dict[str, str] = {
    "cgtool": "cgtool JSON Lines (requests or batches)",
    "azure": "Azure LLM inference trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens)",
    "burstgpt": "BurstGPT CSV (Timestamp,Model,Request tokens,Response tokens,…)",
    "mooncake": "Mooncake JSONL (timestamp ms, input_length, output_length, hash_ids)",
    "sglang-log": "SGLang server log ('Prefill batch' / 'Decode batch' lines) → batches",
    "vllm-metrics": "vLLM log with --cudagraph-metrics tables → batches",
}


def load_trace(
    path: str | Path,
    trace_format: str = "cgtool",
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    decode_log_interval: int = SGLANG_DECODE_LOG_INTERVAL,
) -> ConvertResult:
    """Read a trace in any supported format; `block_tokens` is Mooncake's hash block size and
    `decode_log_interval` SGLang's --decode-log-interval."""
    if block_tokens < 1 or decode_log_interval < 1:
        raise InputError("--block-tokens and --decode-log-interval must be at least 1", "")
    readers: dict[str, Callable[[], ConvertResult]] = {
        "cgtool": lambda: _cgtool(path),
        "azure": lambda: convert_azure(path),
        "burstgpt": lambda: convert_burstgpt(path),
        "mooncake": lambda: convert_mooncake(path, block_tokens),
        "sglang-log": lambda: convert_sglang_log(path, decode_log_interval),
        "vllm-metrics": lambda: convert_vllm_metrics(path),
    }
    if trace_format not in readers:
        raise InputError(
            f"unknown trace format {trace_format!r}", f"Use one of: {', '.join(FORMATS)}."
        )
    return readers[trace_format]()


def _cgtool(path: str | Path) -> ConvertResult:
    trace = read_trace(path)
    if isinstance(trace, RequestTrace):
        return ConvertResult(trace, len(trace), {})
    return ConvertResult(trace, len(trace.decode_count) + len(trace.extend_count), {})


def first_requests(trace: RequestTrace, limit: int) -> RequestTrace:
    """The `limit` earliest requests (a cut for examples and quick tries)."""
    if limit < 1:
        raise InputError(f"--limit is {limit}, but must be at least 1", "")
    return trace.take(slice(0, limit))
