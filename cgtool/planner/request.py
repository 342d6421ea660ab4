"""What a plan is asked for: the model, GPU, engine and limits, besides the trace."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cgtool.errors import InputError
from cgtool.planner.bounds import check_server_limits
from cgtool.planner.engine_buffers import check_attention_backend
from cgtool.planner.parallel import check_tp_size
from cgtool.planner.scenarios import DEFAULT_LOADS
from cgtool.specs.config import ModelConfig
from cgtool.specs.gpus import GpuSpec
from cgtool.specs.hidden_states import HiddenMode


@dataclass(frozen=True, slots=True)
class PlanRequest:
    """Everything a plan depends on besides the trace."""

    cfg: ModelConfig
    gpu: GpuSpec
    engine: str = "sglang"
    engine_version: str | None = None
    trace_name: str = ""
    profile: dict[str, Any] | None = None  # a capture report's dict
    profile_name: str | None = None
    tp_size: int = 1
    chunked_prefill_size: int | None = None
    max_running_requests: int | None = None
    budget_graphs: int | None = None
    budget_memory_bytes: int | None = None
    loads: tuple[float, ...] = DEFAULT_LOADS
    replicas: int = 1
    # An existing plan's (decode sizes, token sizes, KV tokens) to score beside the new one.
    compare: tuple[tuple[int, ...], tuple[int, ...], int] | None = None
    compare_name: str | None = None
    hidden_mode: HiddenMode = HiddenMode.NULL  # decode graphs' hidden-state mode (--hidden-states)
    attention_backend: str | None = None  # SGLang's --attention-backend; None: SGLang's choice

    def __post_init__(self) -> None:
        check_tp_size(self.cfg, self.tp_size, self.gpu)
        check_attention_backend(self.attention_backend, self.engine, self.engine_version)
        check_server_limits(self.cfg, self.gpu, self.engine, self.tp_size,
                            self.max_running_requests, self.chunked_prefill_size)
        if not self.loads or any(not (load > 0) for load in self.loads):
            raise InputError(f"--load {self.loads}: loads must be above 0", "Write --load 1,2.")
        if self.replicas < 1:
            raise InputError(
                f"--replicas {self.replicas} is not a number of servers", "Use 1 or more."
            )
