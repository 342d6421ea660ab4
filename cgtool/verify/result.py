"""`verify.json`: what a verification measured beside what the plan predicted.

Written atomically and read back through the same validating converter as reports and
plans (`cgtool.documents.document_io`), so a damaged file is one sentence naming the field.
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
    fail,
    read_json,
    utc_now_iso,
    write_json_atomic,
)
from cgtool.documents.plan_document import check_graph_size, check_graph_sizes
from cgtool.documents.results import Environment, ModelInfo, resolve_document
from cgtool.specs.kinds import GRAPH_KIND_OF_STEP, MAX_GRAPH_SIZE, StepKind

VERIFY_SCHEMA = "cgtool.verify"
VERIFY_FILENAME = "verify.json"


# A sampled step's requests or tokens. The planner builds tables as long as the largest, so a
# garbled figure would ask for terabytes; no step comes near this.
_MAX_STEP_SIZE = MAX_GRAPH_SIZE["piecewise"]


@dataclass(slots=True)
class SizeTiming:
    """Sampled steps of one kind and size through one graph set."""

    kind: StepKind
    size: int
    context: int  # decode: tokens cached per request; extend: cached prefix (sample mean)
    steps: int  # sampled steps at this size
    weight: float  # simulated steps they stand for
    graph_size: int  # the captured size they replayed, 0 when they ran eagerly
    measured_ms: float  # mean over the steps and repeats
    predicted_ms: float  # mean of the plan's cost model over the same steps


@dataclass(slots=True)
class KindTiming:
    kind: StepKind
    weight: float
    measured_ms: float  # weighted mean step time of this kind
    predicted_ms: float


@dataclass(slots=True)
class SetResult:
    """One graph set (the plan's or the engine default's): captured, then replayed."""

    name: Literal["plan", "default"]
    capture_bs: list[int]
    capture_num_tokens: list[int]
    failed_sizes: list[str]  # "decode 256", "piecewise 8192": out of memory while capturing
    capture_s: float  # recording every graph (compilation apart)
    compile_s: float  # torch.compile of the piecewise body, before its captures
    graph_bytes: int  # growth of the set's own graph pool plus memory outside torch
    predicted_graph_bytes: int  # plan.json comparison row
    predicted_capture_s: float
    mean_step_ms: float  # weighted mean over the sampled steps, mean of the repeats
    repeat_step_ms: list[float]  # the same, one per repeat
    predicted_step_ms: float  # the plan's cost model on the sampled steps
    plan_expected_step_ms: float  # plan.json comparison row, over the whole simulation
    kinds: list[KindTiming]
    sizes: list[SizeTiming]
    # MLA decode chunks done twice over the timed repeats; None where nothing counts them
    mla_chunks_redone: int | None = None


@dataclass(slots=True)
class Ratio:
    """Plan over default mean step time; below 1 means the plan is faster."""

    mean: float
    ci_low: float
    ci_high: float
    confidence: float
    repeats: list[float]
    verdict: Literal["faster", "slower", "same"]


@dataclass(slots=True)
class Rehearsal:
    """The worst eager steps at the plan's memory fraction, with the plan's graphs held."""

    status: Literal["ok", "oom", "skipped"]
    extend_tokens: int
    decode_bs: int
    decode_context: int
    peak_bytes: int  # torch's peak reservation plus memory outside torch
    headroom_bytes: int  # GPU memory left at that peak
    total_bytes: int
    failed_step: str | None = None  # what ran out of memory
    remedy: str | None = None


@dataclass(slots=True)
class Proof:
    """One more build and rehearsal at the fraction that the first rehearsal's peak says would
    leave `headroom_target_bytes` free (cgtool.verify.proof)."""

    mem_fraction_static: float
    headroom_target_bytes: int
    kv_tokens: int
    graph_bytes: int  # the plan's graphs, captured again at this fraction
    rehearsal: Rehearsal


@dataclass(slots=True)
class VerifySettings:
    plan: str
    trace: str | None
    step_source: Literal["trace", "histogram"]
    mem_fraction_static: float
    fraction_source: Literal["plan", "flag"]
    steps: int
    repeats: int
    seed: int
    kv_tokens: int
    chunked_prefill_size: int
    max_running_requests: int
    simulated_steps: int
    # The prefill graphs' runner; verify.json files written before it was recorded ran
    # torch.compile pieces.
    prefill_backend: str = "piecewise"


@dataclass(slots=True)
class VerifyResult:
    environment: Environment
    model: ModelInfo
    settings: VerifySettings
    rehearsal: Rehearsal
    sets: list[SetResult] = field(default_factory=list)
    ratio: Ratio | None = None  # None when the run stopped before replaying
    status: Literal["complete", "oom"] = "complete"
    reason: str | None = None
    warnings: list[str] = field(default_factory=list)
    created: str = field(default_factory=utc_now_iso)
    provenance: Provenance | None = None  # None only in files written before it existed
    # The largest fraction verify proved (None: none passed, or a file from before proofs),
    # the proof run behind it, and SGLang's default fraction's KV tokens on the same GPU.
    proof: Proof | None = None
    recommended_mem_fraction_static: float | None = None
    # KV tokens a fresh server gets at the recommended and at SGLang's default fraction, from
    # the first build's pool (the proof's process already holds what the first captures loaded).
    recommended_kv_tokens: int | None = None
    default_kv_tokens: int | None = None

    def to_dict(self) -> dict[str, Any]:
        body = dataclasses.asdict(self)
        if body["provenance"] is None:
            del body["provenance"]
        head = {"schema": VERIFY_SCHEMA, "version": FORMAT_VERSION}
        return head | {k: body.pop(k) for k in ("status", "reason", "created")} | body

    @classmethod
    def from_dict(cls, data: Any, source: str = VERIFY_FILENAME) -> VerifyResult:
        check_header(data, VERIFY_SCHEMA, source)
        result = convert(cls, data, source, "")
        for i, graph_set in enumerate(result.sets):
            check_graph_sizes(graph_set.capture_bs, "decode", source, f"sets[{i}].capture_bs")
            check_graph_sizes(graph_set.capture_num_tokens, "piecewise", source, f"sets[{i}].capture_num_tokens")
            for j, row in enumerate(graph_set.sizes):  # a step's size and the graph it replayed (0: eager)
                where = f"sets[{i}].sizes[{j}]"
                if not 1 <= row.size <= _MAX_STEP_SIZE:
                    fail(source, f"{where}.size", f"must be from 1 to {_MAX_STEP_SIZE:,}, got {row.size:,}")
                check_graph_size(row.graph_size, GRAPH_KIND_OF_STEP[row.kind], source, f"{where}.graph_size", least=0)
        return result

    def set(self, name: str) -> SetResult | None:
        return next((s for s in self.sets if s.name == name), None)


def write_verify(result: VerifyResult, path: Path) -> None:
    write_json_atomic(path, result.to_dict())


def load_verify(path: Path) -> VerifyResult:
    path = Path(path)
    if path.is_dir() and (path / VERIFY_FILENAME).is_file():
        path = path / VERIFY_FILENAME
    path = resolve_document(path)
    return VerifyResult.from_dict(read_json(path), str(path))


def is_verify_document(path: Path) -> bool:
    """True when `path` (file or folder) holds a verify.json rather than a report."""
    path = Path(path)
    if path.is_dir():
        return (path / VERIFY_FILENAME).is_file()
    try:
        head = path.read_text(encoding="utf-8", errors="replace")[:4096]
    except OSError:
        return False
    return f'"{VERIFY_SCHEMA}"' in head
