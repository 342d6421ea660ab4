"""The compared figures, from a replay's logs or a prediction's, and the errors between them.

TTFT runs from arrival to the end of the step that computed the prompt's last token; TPOT is
(finish - first token) / (output - 1), over requests with two or more output tokens;
throughput is the output tokens of finished requests over first arrival to last finish.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cgtool.replay.result import Metric, Prediction, RequestLog, StepLog, Summary


def summarise(requests: RequestLog, steps: StepLog) -> Summary:
    kind = np.array(steps.kind)
    size = np.array(steps.size, dtype=np.int64)
    time_ms = np.array(steps.time_ms, dtype=np.float64)
    padded = np.array(steps.padded, dtype=np.int64)
    return _summary(requests, kind, size, time_ms, float(np.mean(padded > 0)) if len(padded) else 0.0)


def summarise_arrays(requests: RequestLog, kind: Sequence[str], size: Sequence[int],
                     time_ms: Sequence[float], graph_share: float) -> Summary:
    return _summary(requests, np.array(kind), np.array(size, dtype=np.int64),
                    np.array(time_ms, dtype=np.float64), graph_share)


def _summary(requests: RequestLog, kind: np.ndarray, size: np.ndarray, time_ms: np.ndarray,
             graph_share: float) -> Summary:
    arrival = np.array(requests.arrival_ms, dtype=np.float64)
    first = _column(requests.first_token_ms)
    finish = _column(requests.finish_ms)
    output = np.maximum(np.array(requests.output_len, dtype=np.int64), 1)
    ttft = (first - arrival)[~np.isnan(first)]
    done = ~np.isnan(finish)
    many = done & (output >= 2)
    tpot = (finish[many] - first[many]) / (output[many] - 1)
    span_ms = (np.nanmax(finish) - arrival.min()) if done.any() else 0.0
    decode = kind == "decode"
    sizes, counts = np.unique(size[decode], return_counts=True)
    return Summary(
        ttft_p50_ms=_pct(ttft, 50), ttft_p99_ms=_pct(ttft, 99),
        tpot_p50_ms=_pct(tpot, 50), tpot_p99_ms=_pct(tpot, 99),
        tpot_mean_ms=float(tpot.mean()) if len(tpot) else 0.0,
        throughput_tok_s=float(output[done].sum() / (span_ms / 1e3)) if span_ms > 0 else 0.0,
        decode_step_ms=float(time_ms[decode].mean()) if decode.any() else 0.0,
        extend_step_ms=float(time_ms[~decode].mean()) if (~decode).any() else 0.0,
        duration_s=float(span_ms / 1e3),
        decode_sizes=sizes.tolist(), decode_counts=counts.tolist(),
        steps=len(kind), graph_share=graph_share,
    )


def _column(values: Sequence[float | None]) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else 0.0


def total_variation(sizes_a: Sequence[int], counts_a: Sequence[int],
                    sizes_b: Sequence[int], counts_b: Sequence[int]) -> float:
    """Half the L1 distance between two histograms, each normalised to a distribution."""
    top = max([0, *sizes_a, *sizes_b]) + 1
    a, b = np.zeros(top), np.zeros(top)
    a[list(sizes_a)] = counts_a
    b[list(sizes_b)] = counts_b
    if not a.sum() or not b.sum():
        return 1.0 if a.sum() != b.sum() else 0.0
    return float(0.5 * np.abs(a / a.sum() - b / b.sum()).sum())


_COMPARED = (
    ("TTFT p50", "ms", "ttft_p50_ms"), ("TTFT p99", "ms", "ttft_p99_ms"),
    ("TPOT p50", "ms", "tpot_p50_ms"), ("TPOT p99", "ms", "tpot_p99_ms"),
    ("TPOT mean", "ms", "tpot_mean_ms"), ("throughput", "tok/s", "throughput_tok_s"),
    ("decode step", "ms", "decode_step_ms"), ("extend step", "ms", "extend_step_ms"),
)


def compare(measured: Summary, prediction: Prediction) -> list[Metric]:
    p = prediction.summary
    rows = []
    for name, unit, attr in _COMPARED:
        m, q = getattr(measured, attr), getattr(p, attr)
        rows.append(Metric(name, unit, m, q, m / q - 1 if q else 0.0, prediction.source))
    tvd = total_variation(measured.decode_sizes, measured.decode_counts, p.decode_sizes, p.decode_counts)
    rows.append(Metric("decode batch TVD", "", tvd, 0.0, tvd, prediction.source))
    return rows
