"""Fused elementwise ops of the decoder: RMSNorm (with the residual add), rope, SiLU-and-mul.

Unfused, these took ~39 of the ~49 kernels a Llama layer launched per decode step; at small
batches each costs a few microseconds of launch and tail however little it computes. Each op
here has a torch reference, exactly what the unfused layers computed, and a Triton kernel
wrapped as a torch custom op so that dynamo keeps it as one opaque node with a dynamic token
dimension. CUDA tensors take the kernel; others take the reference, so the CPU path (the HF
oracle tests) stays numerically what it was.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from cgtool.runtime.batch import scratch_empty
from cgtool.runtime.kv_store import store_kv
from cgtool.runtime.triton_launch import CachedKernel, cdiv, next_power_of_2

# One program covers a whole gate or up chunk of this many elements.
SILU_BLOCK = 1024


def _use_triton(x: torch.Tensor) -> bool:
    return x.is_cuda


def _as_op() -> bool:
    """Dynamo must see one opaque custom op; eager code calls the launcher itself, since a
    custom op's dispatch costs ~170 µs of host time a call (../shared/notes/eager-host-profile.md)."""
    return torch.compiler.is_compiling()


# ---------------------------------------------------------------- dispatch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of x ([..., dim], any leading strides)."""
    if not _use_triton(x):
        return rms_norm_ref(x, weight, eps)
    if _as_op():
        return torch.ops.cgtool.rms_norm(x, weight, eps)
    return _launch_rms_norm(x, None, weight, eps)[0]


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual), the sum rounded to the input dtype first."""
    if not _use_triton(x):
        return fused_add_rms_norm_ref(x, residual, weight, eps)
    if _as_op():
        return torch.ops.cgtool.fused_add_rms_norm(x, residual, weight, eps)
    out, res_out = _launch_rms_norm(x, residual, weight, eps)
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
    out, res_out = _launch_rms_norm(x, residual, weight, eps, in_place=True)
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
    return _launch_rope(q, k, positions, cos_sin)


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
    return _launch_rope_and_store(q, k, v, positions, cos_sin, k_cache, v_cache, loc)


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
    return _launch_rope_and_store_qkv(qkv, heads, kv_heads, head_dim, positions, cos_sin, k_cache, v_cache, loc)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up [n, 2 * I] holding gate and up side by side: [n, I]."""
    if not _use_triton(gate_up):
        return silu_and_mul_ref(gate_up)
    if _as_op():
        return torch.ops.cgtool.silu_and_mul(gate_up)
    return _launch_silu_and_mul(gate_up, eager=True)


# ---------------------------------------------------------------- torch references


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


# ---------------------------------------------------------------- Triton kernels


@triton.jit
def _rms_norm_kernel(
    X, R, W, Out, ResOut, rows_per_token, stride_xt, stride_xh, stride_rt, stride_ot, stride_rot,
    dim, eps, HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    # A row is one head of one token (per-head q/k norm) or, with one row a token, a hidden state.
    row = tl.program_id(0).to(tl.int64)
    token = row // rows_per_token
    head = row % rows_per_token
    offs = tl.arange(0, BLOCK)
    mask = offs < dim
    x = tl.load(X + token * stride_xt + head * stride_xh + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(R + token * stride_rt + offs, mask=mask, other=0.0)
        # Rounded before the norm reads it: the unfused add produced an input-dtype tensor.
        x = (x.to(tl.float32) + r.to(tl.float32)).to(ResOut.dtype.element_ty)
        tl.store(ResOut + token * stride_rot + offs, x, mask=mask)
    xf = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(xf * xf, axis=0) / dim + eps)
    normed = (xf * inv_rms).to(x.dtype)  # the reference scales by the weight in the input dtype
    w = tl.load(W + offs, mask=mask, other=0.0)
    out = normed.to(tl.float32) * w.to(tl.float32)
    tl.store(Out + row * stride_ot + offs, out.to(Out.dtype.element_ty), mask=mask)


@triton.jit
def _rotate_heads(
    X, Out, stride_xh, cos, sin, offs_d, mask_d,
    NUM_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
):
    offs_h = tl.arange(0, BLOCK_H)
    mask = (offs_h < NUM_HEADS)[:, None] & mask_d[None, :]
    x_ptrs = X + offs_h[:, None] * stride_xh + offs_d[None, :]
    x1 = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptrs + HALF, mask=mask, other=0.0).to(tl.float32)
    out_ptrs = Out + offs_h[:, None] * (2 * HALF) + offs_d[None, :]
    tl.store(out_ptrs, (x1 * cos - x2 * sin).to(Out.dtype.element_ty), mask=mask)
    tl.store(out_ptrs + HALF, (x2 * cos + x1 * sin).to(Out.dtype.element_ty), mask=mask)


@triton.jit
def _cos_sin_at(positions, cos_sin, t, stride_cs, offs_d, mask_d, HALF: tl.constexpr):
    pos = tl.load(positions + t).to(tl.int64)
    cos = tl.load(cos_sin + pos * stride_cs + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    sin = tl.load(cos_sin + pos * stride_cs + HALF + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    return cos[None, :], sin[None, :]


@triton.jit
def _rope_kernel(
    Q, K, QOut, KOut, positions, cos_sin, stride_qt, stride_qh, stride_kt, stride_kh, stride_cs,
    NUM_Q_HEADS: tl.constexpr, NUM_K_HEADS: tl.constexpr, HALF: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
):
    # One program a token: its cos/sin row is read once for all q and k heads.
    t = tl.program_id(0).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HALF
    cos, sin = _cos_sin_at(positions, cos_sin, t, stride_cs, offs_d, mask_d, HALF)
    _rotate_heads(
        Q + t * stride_qt, QOut + t * (NUM_Q_HEADS * 2 * HALF), stride_qh, cos, sin, offs_d, mask_d,
        NUM_Q_HEADS, HALF, BLOCK_HQ,
    )
    _rotate_heads(
        K + t * stride_kt, KOut + t * (NUM_K_HEADS * 2 * HALF), stride_kh, cos, sin, offs_d, mask_d,
        NUM_K_HEADS, HALF, BLOCK_HK,
    )


@triton.jit
def _rope_store_kernel(
    Q, K, V, QOut, KCache, VCache, Loc, positions, cos_sin,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_cs,
    NUM_Q_HEADS: tl.constexpr, NUM_K_HEADS: tl.constexpr, HALF: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_V: tl.constexpr,
    K_OFFSET: tl.constexpr, V_OFFSET: tl.constexpr,
):
    # _rope_kernel with the rotated k written to its KV slot instead of a new tensor, and v
    # copied to its slot: the same values the separate store kernel would write. K and V
    # start K_OFFSET and V_OFFSET elements in: Q, K and V may be one qkv output, unsplit.
    K += K_OFFSET
    V += V_OFFSET
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(Loc + t).to(tl.int64)
    row = NUM_K_HEADS * 2 * HALF  # one slot of the cache: [kv_heads, head_dim]
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HALF
    cos, sin = _cos_sin_at(positions, cos_sin, t, stride_cs, offs_d, mask_d, HALF)
    _rotate_heads(
        Q + t * stride_qt, QOut + t * (NUM_Q_HEADS * 2 * HALF), stride_qh, cos, sin, offs_d, mask_d,
        NUM_Q_HEADS, HALF, BLOCK_HQ,
    )
    _rotate_heads(K + t * stride_kt, KCache + slot * row, stride_kh, cos, sin, offs_d, mask_d, NUM_K_HEADS, HALF,
                  BLOCK_HK)
    offs_v = tl.arange(0, BLOCK_V)
    mask_v = offs_v < row
    v = tl.load(V + t * stride_vt + offs_v, mask=mask_v)
    tl.store(VCache + slot * row + offs_v, v.to(VCache.dtype.element_ty), mask=mask_v)


@triton.jit
def _silu_and_mul_kernel(X, Out, stride_xt, stride_ot, inter, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inter
    gate = tl.load(X + t * stride_xt + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(X + t * stride_xt + inter + offs, mask=mask, other=0.0)
    act = (gate / (1.0 + tl.exp(-gate))).to(up.dtype)  # F.silu rounds before the product
    out = act.to(tl.float32) * up.to(tl.float32)
    tl.store(Out + t * stride_ot + offs, out.to(Out.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------- launchers as custom ops

_RMS_NORM = CachedKernel(_rms_norm_kernel)
_ROPE = CachedKernel(_rope_kernel)
_ROPE_STORE = CachedKernel(_rope_store_kernel)
_SILU_AND_MUL = CachedKernel(_silu_and_mul_kernel)


def _norm_warps(block: int) -> int:
    return min(max(block // 512, 1), 8)


def _launch_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
    in_place: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`in_place` (with a residual): the sum over `residual` and the norm over `x` where their
    layouts and dtypes allow. Each program loads its whole row before it stores any of it."""
    dim = x.shape[-1]
    if in_place and residual is not None and _same_layout(x, residual, weight):
        # A decoder layer's two norms a step: nothing to view, promote or allocate.
        _RMS_NORM.launch((x.shape[0],), x, residual, weight, x, residual, 1, dim, dim, dim, dim, dim, dim, eps,
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
    _RMS_NORM.launch(
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
    return _launch_rms_norm(x, None, weight, eps)[0]


@_rms_norm_op.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype))


@torch.library.custom_op("cgtool::fused_add_rms_norm", mutates_args=())
def _fused_add_rms_norm_op(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    out, res_out = _launch_rms_norm(x, residual, weight, eps)
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
    return _launch_rope(q, k, positions, cos_sin)


def _launch_rope(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    q = q if q.stride(-1) == 1 else q.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # [n, heads, head_dim]
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)  # [n, kv_heads, head_dim]
    half = q.shape[-1] // 2
    _ROPE.launch(
        (q.shape[0],), q, k, q_out, k_out, positions, cos_sin, q.stride(0), q.stride(1), k.stride(0),
        k.stride(1), cos_sin.stride(0), NUM_Q_HEADS=q.shape[1], NUM_K_HEADS=k.shape[1],
        HALF=half, BLOCK_D=next_power_of_2(half),
        BLOCK_HQ=next_power_of_2(q.shape[1]), BLOCK_HK=next_power_of_2(k.shape[1]),
        num_warps=4,
    )
    return q_out, k_out


def _launch_rope_and_store(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, loc: torch.Tensor,
) -> torch.Tensor:
    _check_slots(loc, q.shape[0])
    q = q if q.stride(-1) == 1 else q.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    v = v.reshape(v.shape[0], -1)  # [n, kv_heads * head_dim]: a view of a qkv output's slice
    v = v if v.stride(-1) == 1 else v.contiguous()
    q_out = scratch_empty("rope_q", tuple(q.shape), q.dtype, q.device)  # [n, heads, head_dim]
    _ROPE_STORE.launch(
        (q.shape[0],), q, k, v, q_out, k_cache, v_cache, loc, positions, cos_sin,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), cos_sin.stride(0),
        **_rope_store_meta(q.shape[1], k.shape[1], q.shape[-1], 0),
    )
    return q_out


def _launch_rope_and_store_qkv(
    qkv: torch.Tensor, heads: int, kv_heads: int, head_dim: int, positions: torch.Tensor,
    cos_sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, loc: torch.Tensor,
) -> torch.Tensor:
    n = qkv.shape[0]
    _check_slots(loc, n)
    if qkv.stride(1) != 1:
        qkv = qkv.contiguous()
    q_out = scratch_empty("rope_q", (n, heads * head_dim), qkv.dtype, qkv.device)
    row = qkv.stride(0)
    _ROPE_STORE.launch(
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
    return _launch_silu_and_mul(gate_up)


def _launch_silu_and_mul(gate_up: torch.Tensor, eager: bool = False) -> torch.Tensor:
    """`eager`: the output may be the forward's scratch block (`scratch_empty`), which the
    next layer's SiLU overwrites; the custom op always returns a new tensor."""
    if gate_up.stride(-1) != 1:
        gate_up = gate_up.contiguous()
    num_tokens, inter = gate_up.shape[0], gate_up.shape[1] // 2
    shape = (num_tokens, inter)  # [n, I]
    out = (scratch_empty("silu_out", shape, gate_up.dtype, gate_up.device) if eager
           else torch.empty(shape, dtype=gate_up.dtype, device=gate_up.device))
    grid = (num_tokens, cdiv(inter, SILU_BLOCK))
    _SILU_AND_MUL.launch(
        grid, gate_up, out, gate_up.stride(0), out.stride(0), inter, BLOCK=SILU_BLOCK, num_warps=4
    )
    return out


@_silu_and_mul_op.register_fake
def _(gate_up: torch.Tensor) -> torch.Tensor:
    return gate_up.new_empty((gate_up.shape[0], gate_up.shape[1] // 2))
