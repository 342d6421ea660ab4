"""Torch references of the fused ops: exactly what the unfused layers computed.

They are the CPU path (the HF oracle tests) and the oracle the Triton kernels are tested against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cgtool.runtime.kv_store import store_kv


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def fused_add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    residual = x + residual
    return rms_norm_ref(residual, weight, eps), residual


def _rotate_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def apply_rope_ref(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = cos_sin[positions].unsqueeze(1).chunk(2, dim=-1)
    return _rotate_ref(q, cos, sin), _rotate_ref(k, cos, sin)


def apply_rope_and_store_ref(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, loc: torch.Tensor,
) -> torch.Tensor:
    q_out, k_out = apply_rope_ref(q, k, positions, cos_sin)
    store_kv(k_cache, v_cache, loc, k_out.to(k_cache.dtype), v.reshape(k_out.shape).to(v_cache.dtype))
    return q_out


def silu_and_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
