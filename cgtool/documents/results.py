"""Capture reports as typed dataclasses, and the one loader of reports and plans.

A capture report is built from the dataclasses below and written atomically. Reports and
plans (cgtool.documents.plan_document) are read back through `load_document`, which tells them apart
by their schema field; cgtool.documents.document_io checks the header, the major version and every
field, and raises one InputError naming the file and the field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cgtool.documents.document_io import (
    Provenance,
    check_created,
    check_header,
    convert,
    fail,
    read_json,
    utc_now_iso,
    write_json_atomic,
)
from cgtool.documents.plan_document import (
    PLAN_FILENAME,
    PLAN_SCHEMA,
    Plan,
    check_graph_size,
    check_graph_sizes,
)
from cgtool.errors import InputError
from cgtool.specs.hidden_states import HiddenMode
from cgtool.specs.kinds import GRAPH_KINDS, GraphKind

REPORT_SCHEMA = "cgtool.report"
REPORT_FILENAME = "report.json"
# 1.1 adds ViT graphs: the kind "vit" and settings.image_sizes; 1.2 environment.dependent_launch
REPORT_VERSION = "1.3"

Kind = GraphKind
KINDS = GRAPH_KINDS
# What a row's `size` counts, by kind: the label of its column and axis.
SIZE_UNITS: dict[str, str] = {"decode": "batch size", "piecewise": "tokens", "vit": "patches"}
SizeStatus = Literal["ok", "unsafe", "failed"]
# The piecewise body: loaded from the compile cache, traced and stored, traced but not storable,
# or traced with the cache off (--no-compile-cache, or the inductor compiler).
CompileCacheStatus = Literal["hit", "miss", "not_stored", "off"]


@dataclass(slots=True)
class Environment:
    gpu_name: str
    gpu_memory_bytes: int
    driver: str
    cuda: str
    torch: str
    cgtool: str
    hostname: str
    # Whether one token's MoE kernels were launched as programmatic dependents (runtime.
    # dependent_launch): replay times differ with it. None: not a capture, or before 1.2.
    dependent_launch: bool | None = None


@dataclass(slots=True)
class ModelInfo:
    name: str
    architecture: str
    config_hash: str
    dtype: str
    param_bytes: int
    num_layers: int


@dataclass(slots=True)
class CaptureSettings:
    kinds: list[Kind]
    capture_bs: list[int]
    capture_num_tokens: list[int]
    compiler: Literal["eager", "inductor"]
    mem_fraction_static: float
    attention_backend: str
    context_len: int
    enable_cudagraph_gc: bool
    tp_size: int = 1
    hidden_states: list[str] = field(default_factory=lambda: ["null"])  # decode modes, upward
    moe_backend: str = "triton"  # MoE models' experts: "triton" (fused kernel) or "torch" (reference)
    image_sizes: list[list[int]] = field(default_factory=list)  # vit: [height, width] pixels
    # Prefill graphs: torch.compile pieces split at attention, or breakable segments (no compile).
    prefill_backend: Literal["piecewise", "breakable"] = "piecewise"


@dataclass(slots=True)
class SizeResult:
    """One captured graph: `size` is the batch size (decode), token count (piecewise) or
    patch count of one image (vit)."""

    kind: Kind
    size: int
    capture_s: float
    retained_bytes: int  # growth of the shared graph pool while capturing this size
    peak_bytes: int
    non_torch_bytes: int  # device used (mem_get_info) minus torch reserved: graph objects
    eager_ms: float | None  # None only when the size failed
    replay_ms: float | None
    speedup: float | None  # eager_ms / replay_ms
    kernels_per_forward: int
    max_abs_diff: float | None  # max |replay - eager| over the logits
    status: SizeStatus = "ok"
    roofline_ms: float | None = None
    rank: int = 0
    # Half-width of the 95% interval of eager_ms, from the spread pooled over the kind's sizes
    # (totals.sample_spread) and this size's number of samples.
    eager_ci95_ms: float | None = None
    replay_ci95_ms: float | None = None
    max_diff_at: int | None = None  # token (piecewise) or request (decode) of max_abs_diff
    hidden_mode: str = "null"  # the decode graph's hidden-state mode (piecewise: always null)
    # MoE decode: distinct routed experts per MoE layer for this batch (mean over layers)
    experts_active: float | None = None
    # MLA decode: chunks that stage 1 did twice in one replay, all layers, their scores outside
    # its fixed maximum's range (attention.redone_chunks); None where nothing counts them.
    mla_chunks_redone: int | None = None
    eager_samples: int | None = None  # timed calls behind eager_ms (None in older reports)
    replay_samples: int | None = None
    # Decode tokens per request this row was timed at, where it is not settings.context_len: a
    # row merged in from a capture at another --context-len (planner.profile_fit).
    context_len: int | None = None

    @property
    def key(self) -> tuple[Any, ...]:
        # A null row keeps the key it had before modes existed, so old reports still compare.
        base = (self.kind, self.size, self.rank)
        if self.hidden_mode != "null":
            base = (*base, self.hidden_mode)
        return base if self.context_len is None else (*base, self.context_len)


@dataclass(slots=True)
class SampleSpread:
    """One path's calls (eager or replay, short or long calls) over one kind's sizes: the
    standard deviation of each sample from its own size's mean, relative to that mean, with
    its degrees of freedom. Every interval of that path is computed from it."""

    rel_sd: float
    dof: int


@dataclass(slots=True)
class CaptureTotals:
    weights_bytes: int
    kv_pool_bytes: int
    kv_tokens: int
    graph_pool_bytes: int
    peak_bytes: int
    free_before_capture_bytes: int
    free_after_capture_bytes: int
    capture_s: float
    non_torch_bytes: int
    copy_bandwidth_bytes_s: float | None = None
    # Seconds in each phase: load, compile, capture, measure, profile (render: the command's).
    phase_s: dict[str, float] = field(default_factory=dict)
    # SGLang's `mem usage` per kind: free memory before its capture minus after.
    sglang_mem_usage_bytes: dict[str, int] = field(default_factory=dict)
    eager_host_us_per_kernel: float | None = None  # smallest eager decode step
    # Plain PyTorch's host time a kernel on the same host (capture.timing.plain_torch_host_us).
    plain_torch_host_us_per_kernel: float | None = None
    static_buffer_bytes: int = 0  # the runners' static inputs and outputs, outside the pool
    other_torch_bytes: int = 0  # reserved growth outside pool and static buffers (workspaces)
    compile_cache: CompileCacheStatus | None = None  # None: no piecewise kind, or an older report
    # Pooled spread of the timed calls, keyed "kind:path:regime" ("decode:eager:short";
    # a decode recapture's mode is part of its kind: "decode/full").
    sample_spread: dict[str, SampleSpread] = field(default_factory=dict)


@dataclass(slots=True)
class KernelRow:
    name: str
    cuda_ms: float
    launches: int


@dataclass(slots=True)
class Artifacts:
    """Paths relative to the report's folder; kernel tables keyed "kind:size"."""

    memory_snapshot: str | None = None  # the first of memory_snapshots
    chrome_trace: str | None = None  # the first of chrome_traces
    kernel_tables: dict[str, list[KernelRow]] = field(default_factory=dict)
    memory_snapshots: dict[str, str] = field(default_factory=dict)  # by kind
    chrome_traces: dict[str, str] = field(default_factory=dict)  # "kind:size" -> file


@dataclass(slots=True)
class CaptureReport:
    environment: Environment
    model: ModelInfo
    settings: CaptureSettings
    sizes: list[SizeResult]
    totals: CaptureTotals
    artifacts: Artifacts = field(default_factory=Artifacts)
    status: Literal["complete", "incomplete"] = "complete"
    incomplete_reason: str | None = None
    created: str = field(default_factory=utc_now_iso)
    # Tensor parallelism: every rank's totals in rank order (`totals` is rank 0's); empty at TP=1.
    rank_totals: list[CaptureTotals] = field(default_factory=list)
    provenance: Provenance | None = None  # None only in reports written before it existed

    def to_dict(self) -> dict[str, Any]:
        body = dataclasses.asdict(self)
        if not body["rank_totals"]:
            del body["rank_totals"]  # TP=1 reports stay as they were
        if body["provenance"] is None:
            del body["provenance"]
        head = {"schema": REPORT_SCHEMA, "version": REPORT_VERSION}
        order = ("status", "incomplete_reason", "created", "provenance", "environment", "model",
                 "settings")
        return head | {k: body.pop(k) for k in order if k in body} | body

    @classmethod
    def from_dict(cls, data: Any, source: str = REPORT_FILENAME) -> CaptureReport:
        check_header(data, REPORT_SCHEMA, source)
        report = convert(cls, data, source, "")
        check_created(report.created, source)
        check_graph_sizes(report.settings.capture_bs, "decode", source, "settings.capture_bs")
        check_graph_sizes(report.settings.capture_num_tokens, "piecewise", source, "settings.capture_num_tokens")
        _check_sizes(report.sizes, source)
        _check_ranks(report, source)
        return report

    def sizes_of(self, kind: str, rank: int = 0) -> list[SizeResult]:
        """This kind's sizes on one rank in the order they were captured in: by hidden-state
        mode upward (a recapture follows the first capture), each largest first."""
        rows = (s for s in self.sizes if s.kind == kind and s.rank == rank)
        return sorted(rows, key=lambda s: (HiddenMode[s.hidden_mode.upper()], -s.size))

    def kinds(self) -> list[str]:
        return [k for k in KINDS if any(s.kind == k for s in self.sizes)]


def write_report(report: CaptureReport, path: Path) -> None:
    write_json_atomic(path, report.to_dict())


def resolve_document(path: Path) -> Path:
    """A report.json/plan.json file, or a folder holding one of them."""
    path = Path(path)
    if path.is_dir():
        for name in (REPORT_FILENAME, PLAN_FILENAME):
            if (path / name).is_file():
                return path / name
        raise InputError(f"{path}: folder holds neither {REPORT_FILENAME} nor {PLAN_FILENAME}",
                         "Point at a capture or plan output folder.")
    if not path.is_file():
        raise InputError(f"{path}: no such file", "Check the path.")
    return path


def load_document(path: Path) -> CaptureReport | Plan:
    """Load a report or a plan, by its schema field."""
    path = resolve_document(path)
    data = read_json(path)
    if isinstance(data, dict) and data.get("schema") == PLAN_SCHEMA:
        return Plan.from_dict(data, str(path))
    return CaptureReport.from_dict(data, str(path))


def load_report(path: Path) -> CaptureReport:
    document = load_document(path)
    if not isinstance(document, CaptureReport):
        raise InputError(f"{path}: is a plan, not a capture report", "Pass a report.json.")
    return document


def load_plan(path: Path) -> Plan:
    document = load_document(path)
    if isinstance(document, CaptureReport):
        raise InputError(f"{path}: is a capture report, not a plan", "Pass a plan.json.")
    return document


def _check_sizes(sizes: list[SizeResult], source: str) -> None:
    seen: set[tuple] = set()
    for i, row in enumerate(sizes):
        where = f"sizes[{i}]"
        check_graph_size(row.size, row.kind, source, f"{where}.size")
        if row.hidden_mode.upper() not in HiddenMode.__members__:
            fail(source, f"{where}.hidden_mode", f"is {row.hidden_mode!r}, not null, last or full")
        if row.key in seen:
            fail(source, where, f"repeats {row.kind} size {row.size} rank {row.rank}")
        seen.add(row.key)
        for name in ("retained_bytes", "peak_bytes"):  # a pool's growth and a peak are >= 0
            if getattr(row, name) < 0:
                fail(source, f"{where}.{name}", f"is {getattr(row, name)}, below 0 bytes")
        if (row.mla_chunks_redone or 0) < 0:
            fail(source, f"{where}.mla_chunks_redone", f"is {row.mla_chunks_redone}, below 0 chunks")
        if row.status != "failed":
            for name in ("eager_ms", "replay_ms", "speedup"):
                if getattr(row, name) is None:
                    fail(source, f"{where}.{name}", f"is null but status is '{row.status}'")


def _check_ranks(report: CaptureReport, source: str) -> None:
    tp_size = report.settings.tp_size
    if tp_size < 1:
        fail(source, "settings.tp_size", f"must be at least 1, got {tp_size}")
    for i, row in enumerate(report.sizes):
        if not 0 <= row.rank < tp_size:
            fail(source, f"sizes[{i}].rank", f"is {row.rank}, outside 0..{tp_size - 1} (tp_size)")
    if report.rank_totals and len(report.rank_totals) != tp_size:
        fail(source, "rank_totals", f"has {len(report.rank_totals)} ranks, expected {tp_size}")
