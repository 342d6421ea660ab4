"""The optional parts of a model's shapes (rope scaling, mixture of experts, multi-head
latent attention) and the expected-experts rule that MoE weight reads follow."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def expected_experts(num_experts: int, top_k: int, tokens: Any) -> Any:
    """Distinct experts a forward over `tokens` rows (a number or an array) reads in one MoE
    layer when each token picks top_k of num_experts uniformly: each expert is missed by a
    token with probability 1 - top_k / num_experts, so E · (1 - (1 - k/E)^tokens) are hit."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """Llama 3's frequency-dependent rope scaling (rope_type "llama3")."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True, slots=True)
class MoeConfig:
    """Routed experts in every layer from `first_dense_layers` on (SwiGLU experts, softmax
    router, top-k), plus DeepSeek's always-on shared experts."""

    num_experts: int
    top_k: int
    expert_intermediate_size: int
    num_shared_experts: int = 0  # fused into one SwiGLU of num_shared × expert width
    first_dense_layers: int = 0  # DeepSeek's first_k_dense_replace: these keep a dense MLP
    norm_topk_prob: bool = False  # renormalise the top-k weights to sum to one
    routed_scaling_factor: float = 1.0


@dataclass(frozen=True, slots=True)
class MlaConfig:
    """DeepSeek's multi-head latent attention (q_lora_rank null: q is one projection)."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
