"""Launchers of the fused Triton kernels, and the same launchers as torch custom ops.

Eager code calls a launcher directly; under torch.compile the dispatch in `fused` calls the
custom op, which dynamo keeps as one opaque node with a dynamic token dimension.
"""

from __future__ import annotations

import functools

import torch

from cgtool.model import fused_kernels as kernels
from cgtool.runtime.batch import scratch_empty
from cgtool.runtime.triton_launch import cdiv, next_power_of_2

# One program covers a whole gate or up chunk of this many elements.
SILU_BLOCK = 1024


def _norm_warps(block: int) -> int:
    return min(max(block // 512, 1), 8)


def launch_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
    in_place: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`in_place` (with a residual): the sum over `residual` and the norm over `x` where their
    layouts and dtypes allow. Each program loads its whole row before it stores any of it."""
    dim = x.shape[-1]
    if in_place and residual is not None and _same_layout(x, residual, weight):
        # A decoder layer's two norms a step: nothing to view, promote or allocate.
        kernels.RMS_NORM.launch((x.shape[0],), x, residual, weight, x, residual, 1, dim, dim, dim, dim, dim, dim, eps,
                         **_norm_meta(dim, True))
        return x, residual
    if residual is not None:
        assert x.dim() == 2 and residual.stride(-1) == 1, "residual adds are over [tokens, hidden]"
    if x.stride(-1) != 1:
        x = x.contiguous()
    num_tokens = x.shape[0] if x.dim() > 1 else 1
    rows = x.view(num_tokens, -1, dim)  # [tokens, rows_per_token, dim]: a view, never a copy
    res_dtype = x.dtype if residual is None else torch.promote_types(x.dtype, residual.dtype)
    out_dtype = torch.promote_types(res_dtype, weight.dtype)
    if in_place and residual is not None and _writable_over(x, residual, out_dtype, res_dtype):
        out, res_out = x, residual
    else:
        out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
        res_out = None if residual is None else torch.empty(x.shape, dtype=res_dtype, device=x.device)
    kernels.RMS_NORM.launch(
        (rows.shape[0] * rows.shape[1],), rows, residual if residual is not None else rows, weight, out,
        res_out if res_out is not None else out, rows.shape[1], rows.stride(0), rows.stride(1),
        residual.stride(0) if residual is not None else 0, dim, dim, dim, eps,
        **_norm_meta(dim, residual is not None),
    )
    return out, res_out


@functools.cache
def _norm_meta(dim: int, has_residual: bool) -> dict[str, object]:
    block = next_power_of_2(dim)
    return {"HAS_RESIDUAL": has_residual, "BLOCK": block, "num_warps": _norm_warps(block)}


def _same_layout(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> bool:
    """x and residual: contiguous [tokens, dim] of the weight's dtype, in separate memory."""
    return (
        x.dtype == residual.dtype == weight.dtype and x.dim() == 2 and x.shape == residual.shape
        and x.is_contiguous() and residual.is_contiguous() and x.data_ptr() != residual.data_ptr()
    )


def _writable_over(
    x: torch.Tensor, residual: torch.Tensor, out_dtype: torch.dtype, res_dtype: torch.dtype
) -> bool:
    # The kernel writes rows of `dim` contiguous elements at a stride of `dim`.
    return (
        x.dtype == out_dtype and residual.dtype == res_dtype and residual.shape == x.shape
        and x.is_contiguous() and residual.is_contiguous() and x.data_ptr() != residual.data_ptr()
    )


@torch.library.custom_op("cgtool::rms_norm", mutates_args=())
def _rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return launch_rms_norm(x, None, weight, eps)[0]


@_rms_norm_op.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype))


@torch.library.custom_op("cgtool::fused_add_rms_norm", mutates_args=())
def _fused_add_rms_norm_op(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    out, res_out = launch_rms_norm(x, residual, weight, eps)
    assert res_out is not None
    return out, res_out


@_fused_add_rms_norm_op.register_fake
def _(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    res_dtype = torch.promote_types(x.dtype, residual.dtype)
    out_dtype = torch.promote_types(res_dtype, weight.dtype)
    return x.new_empty(x.shape, dtype=out_dtype), x.new_empty(x.shape, dtype=res_dtype)


@torch.library.custom_op("cgtool::apply_rope", mutates_args=())
def _apply_rope_op(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return launch_rope(q, k, positions, cos_sin)


def launch_rope(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    q = q if q.stride(-1) == 1 else q.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # [n, heads, head_dim]
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)  # [n, kv_heads, head_dim]
    half = q.shape[-1] // 2
    kernels.ROPE.launch(
        (q.shape[0],), q, k, q_out, k_out, positions, cos_sin, q.stride(0), q.stride(1), k.stride(0),
        k.stride(1), cos_sin.stride(0), NUM_Q_HEADS=q.shape[1], NUM_K_HEADS=k.shape[1],
        HALF=half, BLOCK_D=next_power_of_2(half),
        BLOCK_HQ=next_power_of_2(q.shape[1]), BLOCK_HK=next_power_of_2(k.shape[1]),
        num_warps=4,
    )
    return q_out, k_out


def launch_rope_and_store(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, loc: torch.Tensor,
) -> torch.Tensor:
    _check_slots(loc, q.shape[0])
    q = q if q.stride(-1) == 1 else q.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    v = v.reshape(v.shape[0], -1)  # [n, kv_heads * head_dim]: a view of a qkv output's slice
    v = v if v.stride(-1) == 1 else v.contiguous()
    q_out = scratch_empty("rope_q", tuple(q.shape), q.dtype, q.device)  # [n, heads, head_dim]
    kernels.ROPE_STORE.launch(
        (q.shape[0],), q, k, v, q_out, k_cache, v_cache, loc, positions, cos_sin,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), cos_sin.stride(0),
        **_rope_store_meta(q.shape[1], k.shape[1], q.shape[-1], 0),
    )
    return q_out


def launch_rope_and_store_qkv(
    qkv: torch.Tensor, heads: int, kv_heads: int, head_dim: int, positions: torch.Tensor,
    cos_sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, loc: torch.Tensor,
) -> torch.Tensor:
    n = qkv.shape[0]
    _check_slots(loc, n)
    if qkv.stride(1) != 1:
        qkv = qkv.contiguous()
    q_out = scratch_empty("rope_q", (n, heads * head_dim), qkv.dtype, qkv.device)
    row = qkv.stride(0)
    kernels.ROPE_STORE.launch(
        (n,), qkv, qkv, qkv, q_out, k_cache, v_cache, loc, positions, cos_sin,
        row, head_dim, row, head_dim, row, cos_sin.stride(0),
        **_rope_store_meta(heads, kv_heads, head_dim, heads * head_dim),
    )
    return q_out


def _check_slots(loc: torch.Tensor, num_tokens: int) -> None:
    if loc.shape[0] != num_tokens:  # the kernel reads a slot per token: a short loc reads past it
        raise ValueError(f"{loc.shape[0]} KV slots for {num_tokens} tokens")


@functools.cache
def _rope_store_meta(heads: int, kv_heads: int, head_dim: int, k_offset: int) -> dict[str, int]:
    """The rope-and-store kernel's constexprs, the same for every layer and step of a model:
    built once, not at each launch. `k_offset` 0: separate q, k and v tensors."""
    half = head_dim // 2
    return {
        "NUM_Q_HEADS": heads, "NUM_K_HEADS": kv_heads, "HALF": half, "BLOCK_D": next_power_of_2(half),
        "BLOCK_HQ": next_power_of_2(heads), "BLOCK_HK": next_power_of_2(kv_heads),
        "BLOCK_V": next_power_of_2(kv_heads * head_dim), "K_OFFSET": k_offset,
        "V_OFFSET": k_offset + kv_heads * head_dim if k_offset else 0, "num_warps": 4,
    }


@_apply_rope_op.register_fake
def _(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return q.new_empty(q.shape), k.new_empty(k.shape)


@torch.library.custom_op("cgtool::silu_and_mul", mutates_args=())
def _silu_and_mul_op(gate_up: torch.Tensor) -> torch.Tensor:
    return launch_silu_and_mul(gate_up)


def launch_silu_and_mul(gate_up: torch.Tensor, eager: bool = False) -> torch.Tensor:
    """`eager`: the output may be the forward's scratch block (`scratch_empty`), which the
    next layer's SiLU overwrites; the custom op always returns a new tensor."""
    if gate_up.stride(-1) != 1:
        gate_up = gate_up.contiguous()
    num_tokens, inter = gate_up.shape[0], gate_up.shape[1] // 2
    shape = (num_tokens, inter)  # [n, I]
    out = (scratch_empty("silu_out", shape, gate_up.dtype, gate_up.device) if eager
           else torch.empty(shape, dtype=gate_up.dtype, device=gate_up.device))
    grid = (num_tokens, cdiv(inter, SILU_BLOCK))
    kernels.SILU_AND_MUL.launch(
        grid, gate_up, out, gate_up.stride(0), out.stride(0), inter, BLOCK=SILU_BLOCK, num_warps=4
    )
    return out


@_silu_and_mul_op.register_fake
def _(gate_up: torch.Tensor) -> torch.Tensor:
    return gate_up.new_empty((gate_up.shape[0], gate_up.shape[1] // 2))
