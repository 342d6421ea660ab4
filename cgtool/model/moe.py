"""Mixture-of-experts MLP: a softmax router, top-k SwiGLU experts, DeepSeek's shared experts.

The torch reference runs every token through every expert and weights the results by a
routing matrix that is zero outside each token's top k. That wastes work, but its shapes are
static and it never syncs with the host, so it captures; and it is the oracle that a fused
kernel is tested against.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from cgtool.model.fused import silu_and_mul_ref
from cgtool.model.layers import SwiGLU
from cgtool.model.moe_routing import fused_route
from cgtool.model.moe_triton import fused_experts
from cgtool.specs.config import ModelConfig
from cgtool.specs.config_parts import MoeConfig

# "torch" runs the reference; "triton" the fused kernel (moe_triton), which reads only the
# routed experts. Models are built with the reference (it runs anywhere); capture switches a
# model on the GPU to the kernel with `use_moe_backend`.
MOE_BACKENDS = ("torch", "triton")


def route(router_logits: torch.Tensor, moe: MoeConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp32 weights [n, top_k], expert ids [n, top_k]) of each token: softmax over all
    experts, then the top k, renormalised when the model says so (Qwen3-MoE, not DeepSeek-V2)."""
    probs = router_logits.float().softmax(dim=-1)
    weights, ids = probs.topk(moe.top_k, dim=-1)
    if moe.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights * moe.routed_scaling_factor, ids


def experts_ref(
    x: torch.Tensor,  # [n, hidden]
    gate_up: torch.Tensor,  # [E, 2 * I, hidden]: each expert's gate rows, then its up rows
    down: torch.Tensor,  # [E, hidden, I]
    weights: torch.Tensor,  # [n, top_k] fp32
    ids: torch.Tensor,  # [n, top_k]
) -> torch.Tensor:
    """Σ over each token's top-k experts of weight × expert(x): [n, hidden]."""
    combine = torch.zeros(x.shape[0], gate_up.shape[0], dtype=torch.float32, device=x.device)
    combine.scatter_(1, ids, weights)  # [n, E], zero outside the top k
    act = silu_and_mul_ref(torch.einsum("nh,eih->nei", x, gate_up))  # [n, E, I]
    return torch.einsum("nei,ehi->nh", act * combine.unsqueeze(-1).to(x.dtype), down)


class Experts(nn.Module):
    """All routed experts of one layer, stacked as SGLang's FusedMoE and HF transformers 5
    keep them; checkpoints name them one by one (experts.{e}.gate_proj), see the loader."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int, backend: str = "torch") -> None:
        super().__init__()
        if backend not in MOE_BACKENDS:
            raise ValueError(f"moe backend {backend!r}: expected one of {MOE_BACKENDS}")
        self.backend = backend
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))
        # nn.Linear's default range, so random experts are scaled like the rest of the model
        nn.init.uniform_(self.gate_up_proj, -(hidden**-0.5), hidden**-0.5)
        nn.init.uniform_(self.down_proj, -(intermediate**-0.5), intermediate**-0.5)

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        if self.backend == "triton":
            return fused_experts(x, self.gate_up_proj, self.down_proj, weights, ids)
        return experts_ref(x, self.gate_up_proj, self.down_proj, weights, ids)


class SparseMoE(nn.Module):
    def __init__(self, cfg: ModelConfig, moe_backend: str = "torch") -> None:
        super().__init__()
        assert cfg.moe is not None
        self.moe = moe = cfg.moe
        width = moe.expert_intermediate_size
        self.gate = nn.Linear(cfg.hidden_size, moe.num_experts, bias=False)
        self.experts = Experts(moe.num_experts, cfg.hidden_size, width, moe_backend)
        self.shared_experts = (
            SwiGLU(cfg.hidden_size, moe.num_shared_experts * width) if moe.num_shared_experts else None
        )
        # While `count_active_experts` runs: how many distinct experts each forward routed to.
        self.active_counts: list[int] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Router logits in fp32 as DeepSeek computes them: near-ties between experts must not
        # flip with the activation dtype.
        if self.experts.backend == "triton":  # two kernels, not the reference's nine
            moe = self.moe
            weights, ids = fused_route(
                x, self.gate.weight, moe.top_k, moe.norm_topk_prob, moe.routed_scaling_factor
            )
        else:
            weights, ids = route(F.linear(x.float(), self.gate.weight.float()), self.moe)
        if self.active_counts is not None:
            self.active_counts.append(int(ids.unique().numel()))  # a host sync: never while capturing
        out = self.experts(x, weights, ids)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out


def use_moe_backend(model: nn.Module, backend: str) -> None:
    """Runs every MoE layer of `model` on `backend` (see MOE_BACKENDS)."""
    if backend not in MOE_BACKENDS:
        raise ValueError(f"moe backend {backend!r}: expected one of {MOE_BACKENDS}")
    for module in model.modules():
        if isinstance(module, Experts):
            module.backend = backend


@contextmanager
def count_active_experts(model: nn.Module) -> Iterator[list[int]]:
    """Within the block, each MoE layer's forward appends how many distinct experts its tokens
    were routed to; the list holds them all, in call order. Eager forwards only: counting syncs."""
    counts: list[int] = []
    layers = [m for m in model.modules() if isinstance(m, SparseMoE)]
    for layer in layers:
        layer.active_counts = counts
    try:
        yield counts
    finally:
        for layer in layers:
            layer.active_counts = None
