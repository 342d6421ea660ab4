"""Fused elementwise ops of the decoder: RMSNorm (with the residual add), rope, SiLU-and-mul.

Unfused, these took ~39 of the ~49 kernels a Llama layer launched per decode step; at small
batches each costs a few microseconds of launch and tail however little it computes. Each op
here has a torch reference, exactly what the unfused layers computed, and a Triton kernel
wrapped as a torch custom op so that dynamo keeps it as one opaque node with a dynamic token
dimension. CUDA tensors take the kernel; others take the reference, so the CPU path (the HF
oracle tests) stays numerically what it was. This module only dispatches: the references are in
`fused_ref`, the kernels in `fused_kernels`, their launchers and custom ops in `fused_launch`.
"""

from __future__ import annotations

import torch

from cgtool.model.fused_launch import (
    launch_rms_norm,
    launch_rope,
    launch_rope_and_store,
    launch_rope_and_store_qkv,
    launch_silu_and_mul,
)
from cgtool.model.fused_ref import (
    apply_rope_and_store_ref,
    apply_rope_ref,
    fused_add_rms_norm_ref,
    rms_norm_ref,
    silu_and_mul_ref,
)

# The references are part of this module's interface (the MoE and MLA code and tests use them).
__all__ = [
    "apply_rope", "apply_rope_and_store", "apply_rope_and_store_qkv", "apply_rope_and_store_ref",
    "apply_rope_ref", "fused_add_rms_norm", "fused_add_rms_norm_", "fused_add_rms_norm_ref",
    "rms_norm", "rms_norm_ref", "silu_and_mul", "silu_and_mul_ref",
]


def _use_triton(x: torch.Tensor) -> bool:
    return x.is_cuda


def _as_op() -> bool:
    """Dynamo must see one opaque custom op; eager code calls the launcher itself, since a
    custom op's dispatch costs ~170 µs of host time a call (../shared/notes/eager-host-profile.md)."""
    return torch.compiler.is_compiling()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of x ([..., dim], any leading strides)."""
    if not _use_triton(x):
        return rms_norm_ref(x, weight, eps)
    if _as_op():
        return torch.ops.cgtool.rms_norm(x, weight, eps)
    return launch_rms_norm(x, None, weight, eps)[0]


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual), the sum rounded to the input dtype first."""
    if not _use_triton(x):
        return fused_add_rms_norm_ref(x, residual, weight, eps)
    if _as_op():
        return torch.ops.cgtool.fused_add_rms_norm(x, residual, weight, eps)
    out, res_out = launch_rms_norm(x, residual, weight, eps)
    return out, res_out  # type: ignore[return-value]


def fused_add_rms_norm_(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`fused_add_rms_norm` that may write its two results over `x` and `residual`, as
    SGLang's fused_add_rmsnorm does: a decoder layer's x and residual are dead after its norm,
    and two allocations a norm were 128 of an eager 8B step's ~230 (each microseconds of host
    time). The caller must not read `x` or `residual` again. Functional under torch.compile."""
    if not _use_triton(x):
        return fused_add_rms_norm_ref(x, residual, weight, eps)
    if _as_op():
        return torch.ops.cgtool.fused_add_rms_norm(x, residual, weight, eps)
    out, res_out = launch_rms_norm(x, residual, weight, eps, in_place=True)
    return out, res_out  # type: ignore[return-value]


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [n, heads, head_dim] and k [n, kv_heads, head_dim] (HF half-split layout).

    Inputs may be strided views (of the qkv projection); the outputs are new contiguous
    tensors. `cos_sin` is [max_positions, head_dim]: cos and sin halves side by side.
    """
    if not _use_triton(q):
        return apply_rope_ref(q, k, positions, cos_sin)
    if _as_op():
        return torch.ops.cgtool.apply_rope(q, k, positions, cos_sin)
    return launch_rope(q, k, positions, cos_sin)


def apply_rope_and_store(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, loc: torch.Tensor,
) -> torch.Tensor:
    """`apply_rope`, with the rotated k and v written straight to their KV slots `loc`
    (caches [slots, kv_heads, head_dim]); returns the rotated q. One launch where rope and the
    KV store took two, as SGLang's rope kernel takes a FusedSetKVBufferArg. Eager code only:
    under torch.compile the store stays inside the attention op, where piecewise graphs split."""
    if not _use_triton(q):
        return apply_rope_and_store_ref(q, k, v, positions, cos_sin, k_cache, v_cache, loc)
    return launch_rope_and_store(q, k, v, positions, cos_sin, k_cache, v_cache, loc)


def apply_rope_and_store_qkv(
    qkv: torch.Tensor, heads: int, kv_heads: int, head_dim: int, positions: torch.Tensor,
    cos_sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, loc: torch.Tensor,
) -> torch.Tensor:
    """`apply_rope_and_store` over the qkv projection's output [n, (heads + 2 kv_heads) *
    head_dim] as it is: the kernel finds k and v by their offsets, so the three views of a
    split (~12 µs of host time a layer) are never made. Returns q rotated, [n, heads * head_dim]."""
    if not _use_triton(qkv):
        q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
        q_out = apply_rope_and_store_ref(
            q.view(-1, heads, head_dim), k.view(-1, kv_heads, head_dim), v, positions, cos_sin,
            k_cache, v_cache, loc,
        )
        return q_out.view(-1, heads * head_dim)
    return launch_rope_and_store_qkv(
        qkv, heads, kv_heads, head_dim, positions, cos_sin, k_cache, v_cache, loc
    )


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up [n, 2 * I] holding gate and up side by side: [n, I]."""
    if not _use_triton(gate_up):
        return silu_and_mul_ref(gate_up)
    if _as_op():
        return torch.ops.cgtool.silu_and_mul(gate_up)
    return launch_silu_and_mul(gate_up, eager=True)
