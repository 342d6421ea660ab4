"""`replay.json`: what a replay ran, step by step and request by request, beside the prediction.

Logs are kept as columns (one list per field), which keeps a run of tens of thousands of steps
a file of a few hundred kilobytes. Written atomically, read back through the same validating
converter as reports, plans and verifications.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cgtool.documents.document_io import (
    FORMAT_VERSION,
    Provenance,
    check_header,
    convert,
    read_json,
    utc_now_iso,
    write_json_atomic,
)
from cgtool.documents.results import Environment, ModelInfo
from cgtool.specs.kinds import StepKind

REPLAY_SCHEMA = "cgtool.replay"
REPLAY_FILENAME = "replay.json"


@dataclass(slots=True)
class ReplaySettings:
    trace: str
    schedule: Literal["plan", "default"]
    plan: str | None  # the plan.json the sizes and limits came from
    requests: int  # the slice: the first N requests of the trace
    load: float  # arrival times divided by this
    chunked_prefill_size: int
    max_running_requests: int
    kv_tokens: int  # the KV pool's usable tokens (the simulator's capacity)
    mem_fraction_static: float | None  # None when --max-total-tokens fixed the pool
    capture_bs: list[int]  # decode graphs (as captured; empty on the CPU)
    capture_num_tokens: list[int]  # piecewise graphs
    attention_backend: str
    device: str  # "cuda" or "cpu"
    seed: int
    dropped_requests: int = 0  # longer than the context or the whole pool, as the simulator drops
    profile: str | None = None  # capture report of the prediction, None: the roofline alone
    gpu: str = ""  # the GPU table entry the roofline prediction is for
    # The prefill graphs' runner; replay.json files written before it was recorded ran
    # torch.compile pieces.
    prefill_backend: str = "piecewise"


@dataclass(slots=True)
class RequestLog:
    """Per request of the slice, in arrival order; times in ms from the replay's start."""

    arrival_ms: list[float] = field(default_factory=list)
    input_len: list[int] = field(default_factory=list)
    cached_len: list[int] = field(default_factory=list)
    output_len: list[int] = field(default_factory=list)
    first_token_ms: list[float | None] = field(default_factory=list)  # None: never reached
    finish_ms: list[float | None] = field(default_factory=list)


@dataclass(slots=True)
class StepLog:
    """Per step run, in order."""

    kind: list[StepKind] = field(default_factory=list)
    size: list[int] = field(default_factory=list)  # requests (decode) or tokens (extend)
    padded: list[int] = field(default_factory=list)  # the graph's size; 0 when it ran eagerly
    start_ms: list[float] = field(default_factory=list)  # when the scheduler was asked
    time_ms: list[float] = field(default_factory=list)  # to the step's result on the host
    context: list[int] = field(default_factory=list)  # decode: tokens held by its requests
    pairs: list[float] = field(default_factory=list)  # extend: causal (query, key) pairs

    def append(self, kind: StepKind, size: int, padded: int, start_ms: float,
               time_ms: float, context: int, pairs: float) -> None:
        self.kind.append(kind)
        self.size.append(size)
        self.padded.append(padded)
        self.start_ms.append(round(start_ms, 4))
        self.time_ms.append(round(time_ms, 4))
        self.context.append(context)
        self.pairs.append(pairs)

    def __len__(self) -> int:
        return len(self.kind)


@dataclass(slots=True)
class Summary:
    """The figures compared: latencies in ms, throughput in output tokens per second."""

    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p99_ms: float
    tpot_mean_ms: float
    throughput_tok_s: float
    decode_step_ms: float  # mean over decode steps
    extend_step_ms: float
    duration_s: float  # first arrival to last finish
    decode_sizes: list[int]  # the decode batch-size histogram
    decode_counts: list[int]
    steps: int
    graph_share: float  # share of steps that replayed a graph (measured; predicted: by schedule)


@dataclass(slots=True)
class Prediction:
    source: str  # "roofline" or the capture report's path
    summary: Summary
    policy_agrees: bool  # the step-by-step policy made the simulator's histograms
    note: str = ""


@dataclass(slots=True)
class Metric:
    name: str
    unit: str
    measured: float
    predicted: float
    error: float  # measured / predicted - 1; for the histogram the distance itself
    source: str  # which prediction


@dataclass(slots=True)
class ReplayResult:
    environment: Environment
    model: ModelInfo
    settings: ReplaySettings
    requests: RequestLog
    steps: StepLog
    schema: str = REPLAY_SCHEMA
    version: str = FORMAT_VERSION
    status: Literal["complete", "incomplete"] = "complete"
    reason: str | None = None  # why incomplete
    created: str = field(default_factory=utc_now_iso)
    provenance: Provenance | None = None
    measured: Summary | None = None
    predictions: list[Prediction] = field(default_factory=list)
    metrics: list[Metric] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def write_replay(result: ReplayResult, path: Path) -> None:
    write_json_atomic(path, result.to_dict())


def load_replay(path: Path) -> ReplayResult:
    data = read_json(Path(path))
    check_header(data, REPLAY_SCHEMA, str(path))
    return convert(ReplayResult, data, str(path), "")


def is_replay_document(path: Path) -> bool:
    """A replay.json (by its schema), without validating the rest."""
    try:
        data = read_json(Path(path))
    except Exception:  # noqa: BLE001 - any unreadable file is simply not one
        return False
    return isinstance(data, dict) and data.get("schema") == REPLAY_SCHEMA
