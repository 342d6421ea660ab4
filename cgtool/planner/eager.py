"""The eager cost of a step is uncertain, so plans are made against a range of it.

Two published views disagree by several times. The seed notes give decode graphs a 10-30%
gain at batch 1-32 (a fast host: the GPU is the bottleneck even eagerly); that is the roofline
model's own eager table, `low`. An early cgtool capture of llama-3.1-8b on an H100 host
(benchmarks/results/h100-2026-11-23-eager-host-bound/both-llama-3.1-8b.report.json) measured
eager decode at 34.5 ms against a 7.2 ms replay at batch 1, and 28.5 vs 22.1 ms at batch 256:
eager PyTorch there is bound by the host, which took 93 us to launch each kernel (the report's
`eager_host_us_per_kernel`). `high` models that: an eager step takes the longer of the GPU's
work and the host's launches. A capture report (`--profile`) measures the host that will
serve, and replaces the range with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cgtool.planner.cost import CostModel, kernels_per_forward
from cgtool.specs.config import ModelConfig

# Host time per kernel of host-bound eager PyTorch (measured, see above).
HOST_BOUND_MS_PER_KERNEL = 0.093


@dataclass(frozen=True, eq=False)
class EagerAssumption:
    name: str  # "low", "high" or "measured"
    basis: str  # one sentence: where the figure comes from
    cost: CostModel  # the cost model with this eager table


def eager_range(cost: CostModel, cfg: ModelConfig, tp_size: int = 1) -> list[EagerAssumption]:
    """The assumptions a plan must hold up under: measured when `cost`'s eager times are (a
    capture report's), else the low (roofline) and high (host-bound) ends around its tables."""
    if cost.source != "roofline" and cost.eager_measured:
        return [
            EagerAssumption("measured", f"eager and replay times measured in {cost.source}", cost)
        ]
    low_basis = "roofline" if cost.source == "roofline" else f"replay times from {cost.source}, eager steps by the roofline"
    host_ms = kernels_per_forward(cfg, tp_size) * HOST_BOUND_MS_PER_KERNEL
    high = _with_eager(
        cost,
        np.maximum(cost.decode_eager_ms, host_ms),
        np.maximum(cost.extend_eager_ms, host_ms),
    )
    ratio_low = float(cost.decode_eager_ms[1] / cost.decode_graph_ms[1])
    ratio_high = float(high.decode_eager_ms[1] / high.decode_graph_ms[1])
    return [
        EagerAssumption(
            "low", f"{low_basis}: eager decode {ratio_low:.2f}x a replay at bs 1 (fast host)", cost
        ),
        EagerAssumption(
            "high",
            f"host-bound: eager decode {ratio_high:.1f}x a replay at bs 1 "
            f"({HOST_BOUND_MS_PER_KERNEL * 1e3:.0f} us a kernel, as measured on an H100 host)",
            high,
        ),
    ]


def _with_eager(cost: CostModel, decode_eager: np.ndarray, extend_eager: np.ndarray) -> CostModel:
    values = {name: getattr(cost, name) for name in CostModel.__dataclass_fields__}
    values.update(decode_eager_ms=decode_eager, extend_eager_ms=extend_eager)
    return CostModel(**values)
