"""plan.json as typed dataclasses: what `cgtool plan` returns, writes, and every reader reads.

The planner builds this document directly (cgtool.planner.plan) and readers (reports,
`check`, `verify`, `capture --plan`) get the same type back from `load_plan`, so a plan
has one shape in memory and on disk. It is the document rather than the planner's working
objects because it must also load plans written by older versions: fields they lack are
optional here. The memory plan is built as this document's PlanMemory; the simulator's
numpy histograms stay internal to the planner, which copies them in when it finishes.

`Plan.from_dict` checks the header and every field through cgtool.documents.document_io, so a damaged
file is one sentence naming the file and the field; `to_dict` writes the plan.json layout of
docs/formats.md, keys in the same order.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cgtool.documents.document_io import (
    Provenance,
    check_header,
    convert,
    fail,
    utc_now_iso,
    write_json_atomic,
)
from cgtool.specs.kinds import MAX_GRAPH_SIZE, GraphKind

PLAN_SCHEMA = "cgtool.plan"
# 1.2 adds the histograms' attention_ms; 1.3 the optional `vit`; 1.4 `closed_loop`
PLAN_VERSION = "1.4"
PLAN_FILENAME = "plan.json"


@dataclass(slots=True, kw_only=True)
class PlanInputs:
    """What the plan was made from. Fields with defaults are absent from older plans."""

    trace: str
    trace_kind: str | None = None  # "requests" or "batches"
    model: str
    gpu: str
    engine: str
    engine_version: str | None = None
    profile: str | None = None  # the --profile file, or None for the roofline
    tp_size: int = 1
    chunked_prefill_size: int | None = None
    max_running_requests: int | None = None
    context_len: int | None = None
    loads: list[float] = field(default_factory=lambda: [1.0])
    replicas: int = 1
    compare_plan: str | None = None


@dataclass(slots=True)
class StepHistogram:
    """Simulated steps of one kind: how often each size ran and for how long."""

    sizes: list[int]  # ascending
    counts: list[int]
    time_s: list[float]
    # Summed attention ms per size (context reads, query-key work); absent before 1.2.
    attention_ms: list[float] | None = None


@dataclass(slots=True)
class DecodePlan:
    capture_bs: list[int]
    max_bs: int
    histogram: StepHistogram
    default_capture_bs: list[int]


@dataclass(slots=True)
class PiecewisePlan:
    capture_num_tokens: list[int]
    max_tokens: int
    histogram: StepHistogram
    default_capture_num_tokens: list[int]


_ENGINE_BUFFER_FIELDS = (
    "attention_backend", "attention_buffer_bytes", "static_input_bytes",
    "default_attention_buffer_bytes", "default_static_input_bytes",
)


@dataclass(slots=True, kw_only=True)
class VitPlan:
    """ViT graphs for a trace whose requests carry images (cgtool.planner.vit builds it)."""

    preset: str  # the vision preset whose processor snapped the images
    env: str  # SGLang's switch for ViT graphs, set in the server's environment
    num_images: int
    refused_images: int  # sizes the processor refuses (aspect ratio): no patch count
    capture_patches: list[int]  # patch counts that get a graph, most frequent first
    image_sizes: list[list[int]]  # [height, width] px per capture_patches entry: its commonest
    coverage: float  # share of the trace's images whose patch count has a graph
    min_share: float  # a patch count gets a graph when it serves this share of the images


@dataclass(slots=True, kw_only=True)
class PlanMemory:
    """The memory plan (cgtool.planner.memory.plan_memory builds it); every byte figure is
    one GPU's. Figures a 1.0 plan lacks are optional here; the planner fills them all."""

    gpu_memory_bytes: int
    weights_bytes: int
    graph_bytes: int
    activation_bytes: int
    margin_bytes: int
    kv_bytes: int
    kv_tokens: int
    mem_fraction_static: float  # SGLang
    gpu_memory_utilization: float | None = None  # vLLM; absent from 1.0 plans
    trtllm_free_gpu_memory_fraction: float | None = None  # TensorRT-LLM; absent from 1.0 plans
    default_mem_fraction_static: float
    default_kv_tokens: int | None = None
    peak_kv_demand_tokens: int | None = None
    reachable_batch: int | None = None
    warnings: list[str]
    graph_bytes_measured: int | None = None  # with --profile
    graph_bytes_predicted: int | None = None
    tp_size: int = 1
    kv_heads_per_rank: int | None = None
    # SGLang's attention backend and its graph-time buffers at the largest decode size, both
    # part of graph_bytes (cgtool.planner.engine_buffers); absent for other engines and in
    # older plans.
    attention_backend: str | None = None
    attention_buffer_bytes: int | None = None
    static_input_bytes: int | None = None
    default_attention_buffer_bytes: int | None = None  # the same at the default's largest size
    default_static_input_bytes: int | None = None
    # Where mem_fraction_static comes from: "predicted" (the terms above) or "proven" (a
    # verify.json's rehearsal passed at it on this GPU, cgtool.planner.proven); older plans omit it.
    fraction_source: str | None = None
    margin_parts: dict[str, int] | None = None  # the margin's named parts (cgtool.planner.margin)


@dataclass(frozen=True, slots=True)
class ScheduleScore:
    """A capture schedule scored on simulated steps (cgtool.planner.scoring scores it)."""

    schedule: str  # "plan", "default", or "current" (--compare-plan)
    expected_step_ms: float
    decode_coverage: float  # share of decode steps that replay a graph
    extend_coverage: float
    padding_waste: float  # share of rows (decode) and tokens (extend) computed only as padding
    num_graphs: int
    graph_bytes: int
    capture_s: float
    kv_tokens: int
    comm_ms: float = 0.0  # tensor-parallel collectives inside expected_step_ms


@dataclass(frozen=True, slots=True, kw_only=True)
class ScenarioScore(ScheduleScore):
    """One row of `scenarios`: a score on one part, load and eager-cost assumption."""

    part: Literal["fit", "held_out"]
    load: float
    eager: str


@dataclass(frozen=True, slots=True)
class ClosedLoopRow:
    """One schedule served with its own step times at one load under one eager-cost
    assumption (cgtool.planner.closed_loop): what a client would see, predicted."""

    schedule: str  # "plan", "default", or "current" (--compare-plan)
    load: float
    eager: str
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_ms: float  # time per output token after the first
    tpot_p99_ms: float
    output_tokens_per_s: float
    mean_queue_s: float
    p99_queue_s: float
    median_decode_batch: int  # half of the decode steps run at or below this batch
    largest_decode_batch: int
    decode_eager_share: float  # decode steps with no graph to replay
    finished_share: float  # below 1 only when the run was stopped
    duration_s: float
    max_bs: int  # the schedule's largest decode graph
    num_graphs: int
    graph_bytes: int
    capture_s: float
    kv_tokens: int


@dataclass(slots=True)
class LoadSummary:
    load: float
    duration_s: float
    steps: int
    mean_queue_s: float
    p99_queue_s: float
    peak_kv_demand_tokens: int
    largest_decode_batch: int
    overloaded: bool


@dataclass(slots=True, kw_only=True)
class Simulation:
    """The first load's simulation; fields that are None are not written (batch traces and
    older plans have none of them)."""

    num_requests: int
    dropped_requests: int
    duration_s: float
    steps: int
    mean_queue_s: float
    p99_queue_s: float
    simulated_kv_tokens: int | None = None
    pool_rounds: int | None = None
    typical_request_tokens: int | None = None
    loads: list[LoadSummary] | None = None
    replicas: int | None = None
    peak_kv_demand_tokens: int | None = None


@dataclass(slots=True)
class EagerAssumption:
    name: str
    basis: str


@dataclass(slots=True)
class PlanBasis:
    """What the plan's figures rest on and how they were checked."""

    statement: str
    cost_model: str
    eager_assumptions: list[EagerAssumption]
    held_out_share: float
    fit_steps: int
    held_out_steps: int
    max_bs_reason: str
    largest_batch_fitted: int
    worst_regret: float
    token_grid: str
    min_bin_share: float
    replicas: int
    replicas_asked: int


@dataclass(slots=True, kw_only=True)
class Plan:
    status: Literal["complete", "incomplete"] = "complete"
    created: str = field(default_factory=utc_now_iso)
    provenance: Provenance | None = None  # None only in plans written before it existed
    inputs: PlanInputs
    decode: DecodePlan
    piecewise: PiecewisePlan
    memory: PlanMemory
    comparison: list[ScheduleScore]  # held-out at the first load (fit when none is held out)
    comparison_fit: list[ScheduleScore] = field(default_factory=list)
    scenarios: list[ScenarioScore] = field(default_factory=list)
    basis: PlanBasis | None = None  # None only in 1.0 plans
    flags: dict[str, list[str]]  # by engine: sglang (always), vllm, trtllm
    simulation: Simulation
    warnings: list[str] = field(default_factory=list)
    vit: VitPlan | None = None  # only for a trace with images; absent before 1.3
    closed_loop: list[ClosedLoopRow] = field(default_factory=list)  # absent before 1.4

    def row(self, schedule: str) -> ScheduleScore | None:
        """The comparison row of "plan" or "default"."""
        return next((r for r in self.comparison if r.schedule == schedule), None)

    def all_warnings(self) -> list[str]:
        return self.memory.warnings + self.warnings

    def to_dict(self) -> dict[str, Any]:
        body = dataclasses.asdict(self)
        for name in ("provenance", "basis", "vit"):
            if body[name] is None:
                del body[name]
        if not body["closed_loop"]:  # batch-trace plans and plans before 1.4 have none
            del body["closed_loop"]
        for kind in ("decode", "piecewise"):
            if body[kind]["histogram"]["attention_ms"] is None:
                del body[kind]["histogram"]["attention_ms"]
        body["simulation"] = {k: v for k, v in body["simulation"].items() if v is not None}
        for name in _ENGINE_BUFFER_FIELDS + ("fraction_source", "margin_parts"):  # SGLang, newer plans
            if body["memory"][name] is None:
                del body["memory"][name]
        # Scenario rows lead with what they are scored on, as the planner wrote them.
        lead = ("part", "load", "eager")
        body["scenarios"] = [{k: row[k] for k in lead} | row for row in body["scenarios"]]
        return {"schema": PLAN_SCHEMA, "version": PLAN_VERSION} | body

    @classmethod
    def from_dict(cls, data: Any, source: str = PLAN_FILENAME) -> Plan:
        check_header(data, PLAN_SCHEMA, source)
        for name in ("status", "created"):  # defaults for the planner, required in a file
            if name not in data:
                fail(source, name, "is missing")
        plan = convert(cls, data, source, "")
        if "sglang" not in plan.flags:
            fail(source, "flags.sglang", "is missing")
        for name in ("capture_bs", "default_capture_bs"):
            check_graph_sizes(getattr(plan.decode, name), "decode", source, f"decode.{name}")
        check_graph_size(plan.decode.max_bs, "decode", source, "decode.max_bs", least=0)
        for name in ("capture_num_tokens", "default_capture_num_tokens"):
            check_graph_sizes(getattr(plan.piecewise, name), "piecewise", source, f"piecewise.{name}")
        check_graph_size(plan.piecewise.max_tokens, "piecewise", source, "piecewise.max_tokens", least=0)
        return plan


def check_graph_size(size: int, kind: GraphKind, source: str, where: str, least: int = 1) -> None:
    """A graph size within `least` and the kind's MAX_GRAPH_SIZE: past it a table the planner
    indexes by size would outgrow memory."""
    if not least <= size <= MAX_GRAPH_SIZE[kind]:
        fail(source, where, f"must be from {least} to {MAX_GRAPH_SIZE[kind]:,} for a {kind} graph, got {size:,}")


def check_graph_sizes(sizes: list[int], kind: GraphKind, source: str, where: str) -> None:
    """check_graph_size for every size of a list, each named by its index."""
    for i, size in enumerate(sizes):
        check_graph_size(size, kind, source, f"{where}[{i}]")


def write_plan(plan: Plan, path: Path) -> None:
    write_json_atomic(path, plan.to_dict())
