"""What a capture session is asked to do, what it reports while it runs, and what it has
gathered so far (kept whole when a size fails or a signal arrives)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from cgtool.documents.results import (
    CaptureTotals,
    CompileCacheStatus,
    KernelRow,
    ModelInfo,
    SampleSpread,
    SizeResult,
)
from cgtool.errors import EnvironmentProblem
from cgtool.runners.sizes import capture_sizes
from cgtool.specs.config import ModelConfig
from cgtool.specs.hidden_states import HiddenMode
from cgtool.specs.kinds import MAX_GRAPH_SIZE

if TYPE_CHECKING:
    from cgtool.capture.measure import ReplayCheck

DEFAULT_MEM_FRACTION_STATIC = 0.85  # cgtool's capture default when neither flag nor plan gives one
# Each size is one captured graph, and SGLang's lists step by 32 batches / 512 tokens at the top:
# up to these limits (specs.kinds.MAX_GRAPH_SIZE) that is already ~2,000 graphs of each kind.
# Past them the size list alone outgrows host memory (1e11 took 24 GiB).
MAX_CAPTURE_SIZES = {"--max-bs": MAX_GRAPH_SIZE["decode"], "--bs": MAX_GRAPH_SIZE["decode"],
                     "--max-tokens": MAX_GRAPH_SIZE["piecewise"], "--tokens": MAX_GRAPH_SIZE["piecewise"]}


@dataclass(frozen=True)
class CaptureOptions:
    model: str
    kinds: tuple[str, ...]
    capture_bs: list[int]
    capture_num_tokens: list[int]
    mem_fraction_static: float = DEFAULT_MEM_FRACTION_STATIC
    context_len: int = 1024  # tokens already in the KV cache of each decode request
    compiler: str = "eager"
    enable_cudagraph_gc: bool = False
    random_weights: bool = False
    profile: bool = False
    out_dir: Path = Path("cgtool-capture")
    dtype: torch.dtype = torch.bfloat16
    seed: int = 0
    max_total_tokens: int | None = None  # fixes the KV pool's size, as SGLang's flag does
    tp_size: int = 1  # tensor-parallel ranks, one GPU each (run through cgtool.capture.tp)
    # With --profile, the sizes of each kind that get a Chrome trace of their replay.
    profile_sizes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # Decode graphs' hidden-state modes, upward: the first is captured, each next one recaptured.
    hidden_modes: tuple[HiddenMode, ...] = (HiddenMode.NULL,)
    moe_backend: str = "triton"  # MoE experts: the fused Triton kernel, or the dense torch reference
    # ViT graphs (--kind vit): image sizes in pixels (height, width), already on the patch grid.
    image_sizes: tuple[tuple[int, int], ...] = ()
    compile_cache: bool = True  # reuse the piecewise body traced by an earlier run of this model
    prefill_backend: str = "piecewise"  # or "breakable": runners/breakable.py, no torch.compile

    def __post_init__(self) -> None:
        # Kinds not captured keep an empty list; the captured ones follow the one rule.
        for name, kind, flag in (("capture_bs", "decode", "--bs"),
                                 ("capture_num_tokens", "piecewise", "--tokens")):
            try:
                sizes = capture_sizes(getattr(self, name)) if kind in self.kinds else []
            except ValueError as error:
                raise EnvironmentProblem(f"{kind}: {error}", f"Fix {flag}.") from None
            object.__setattr__(self, name, sizes)


@dataclass(frozen=True)
class CaptureProgress:
    kind: str
    phase: str  # "load", "compile", "capture", "measure", "profile"
    size: int | None
    done: int
    total: int
    free_bytes: int


ProgressCallback = Callable[[CaptureProgress], None]


@dataclass(frozen=True)
class CaptureFailure:
    """The first size that ran out of memory, with what the remedies need to say how much."""

    kind: str
    size: int
    free_bytes: int  # free on the device at that moment
    shortfall_bytes: int  # the allocation that failed: at least this much more was needed
    total_bytes: int  # the device's memory, to turn the shortfall into a memory fraction


@dataclass
class SessionState:
    """What the session has gathered so far: kept whole when a size fails or a signal arrives."""

    sizes: list[SizeResult] = field(default_factory=list)
    kernel_tables: dict[str, list[KernelRow]] = field(default_factory=dict)
    incomplete_reason: str | None = None
    failed: CaptureFailure | None = None  # the first (largest) size that ran out of memory
    runners: list[object] = field(default_factory=list)
    cfg: ModelConfig | None = None
    model: ModelInfo | None = None  # set instead of cfg for a model that is no LM (vision tower)
    rank_totals: list[CaptureTotals] = field(default_factory=list)  # every rank's, on rank 0
    totals: CaptureTotals | None = None  # filled as soon as the model and KV pool exist
    phase_s: dict[str, float] = field(default_factory=dict)  # seconds spent in each phase
    stopped_in: str | None = None  # the innermost phase an exception or signal left
    sglang_mem_usage_bytes: dict[str, int] = field(default_factory=dict)  # by kind
    eager_host_ms: float | None = None  # host time to launch the smallest eager decode step
    plain_torch_host_us: float | None = None  # timing.plain_torch_host_us, on this host
    memory_snapshots: dict[str, str] = field(default_factory=dict)  # by kind
    chrome_traces: dict[str, str] = field(default_factory=dict)  # "kind:size" -> file
    # Kernel counts that profile, run once everything is measured (per_size.count_kernels).
    pending_kernel_counts: list[Callable[[], None]] = field(default_factory=list)
    compile_cache: CompileCacheStatus | None = None  # set by the piecewise kind
    # Each timed row with the timings behind it, whose intervals are restated once the
    # kind's pools are complete (per_size.timed_sizes).
    timed_rows: list[tuple[SizeResult, ReplayCheck]] = field(default_factory=list)
    sample_spread: dict[str, SampleSpread] = field(default_factory=dict)  # totals.sample_spread
    # Called as each phase begins, outside its timing: the command saves the report so far, so
    # a process killed or crashed inside the phase still leaves one (issue 34: a SIGTERM while
    # counting kernels left none).
    on_phase: Callable[[str], None] | None = None

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the time spent inside to `phase_s[name]`, kept even if the phase is cut short."""
        start = time.perf_counter()
        try:
            # Inside the try: a signal that lands while the checkpoint is written (it takes a
            # while) still names this phase.
            if self.on_phase is not None:
                self.on_phase(name)
            start = time.perf_counter()  # the checkpoint is not the phase's own time
            yield
        except BaseException:
            self.stopped_in = self.stopped_in or name
            raise
        finally:
            self.phase_s[name] = self.phase_s.get(name, 0.0) + time.perf_counter() - start


def check_capture_size(flag: str, value: int) -> None:
    """Refuse a size past MAX_CAPTURE_SIZES before any list is built from it."""
    limit = MAX_CAPTURE_SIZES[flag]
    if value > limit:
        raise EnvironmentProblem(
            f"{flag} {value} is past the {limit:,} cgtool captures up to (one graph per size: "
            "SGLang's list that far is already ~2,000 graphs)",
            f"Pass {flag} {limit} or less; `cgtool plan` picks the sizes a trace needs.",
        )


def require_cuda() -> None:
    if not torch.cuda.is_available():
        raise EnvironmentProblem(
            "cgtool capture needs a CUDA GPU and none is visible",
            "Run it on a GPU machine; `cgtool plan` works without one.",
        )


def validate_tp(model: str, tp_size: int, visible_gpus: int | None) -> None:
    """Refuse a TP size the model cannot be split into, or more ranks than visible GPUs."""
    from cgtool.model.parallel import check_tp_shapes
    from cgtool.specs.config import load_model_config

    if tp_size < 1:
        raise EnvironmentProblem(f"--tp {tp_size} must be at least 1", "Pass --tp 1 for one GPU.")
    if tp_size == 1:
        return
    check_tp_shapes(load_model_config(model), tp_size)
    if visible_gpus is not None and tp_size > visible_gpus:
        raise EnvironmentProblem(
            f"--tp {tp_size} needs {tp_size} GPUs but {visible_gpus} "
            f"{'is' if visible_gpus == 1 else 'are'} visible",
            "Lower --tp, or make more GPUs visible (CUDA_VISIBLE_DEVICES).",
        )
