"""Triton kernels of the fused ops, each behind a `CachedKernel` that launches it without
Triton's per-call specialisation once it is compiled."""

from __future__ import annotations

import triton
import triton.language as tl

from cgtool.runtime.triton_launch import CachedKernel


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


RMS_NORM = CachedKernel(_rms_norm_kernel)
ROPE = CachedKernel(_rope_kernel)
ROPE_STORE = CachedKernel(_rope_store_kernel)
SILU_AND_MUL = CachedKernel(_silu_and_mul_kernel)
