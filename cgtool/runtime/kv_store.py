"""Writing a batch's new K and V into the pool: one Triton launch for both, on the GPU.

Two `index_copy_` calls a layer were 64 of an 8B decode step's ~450 kernels, each with its
host dispatch; one kernel that writes both halves the launches. It reads K and V where the
layer left them, strided views of the qkv projection included, so V needs no copy first.
Off the GPU the store stays `index_copy_`, numerically the same (a copy is exact).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cgtool.runtime.dependent_launch import dependent_launch, release_next_kernel
from cgtool.runtime.triton_launch import CachedKernel, cdiv

# One program writes this many elements of a token's row (kv_heads * head_dim, or the latent).
STORE_BLOCK = 1024


@triton.jit
def _store_kv_kernel(
    K, V, KCache, VCache, Loc, stride_kt, stride_vt, row,
    HAS_V: tl.constexpr, BLOCK: tl.constexpr, RELEASE: tl.constexpr,
):
    # The attention after it may be scheduled at once: MLA decode's Gluon stage 1, launched as
    # its dependent, then waits only for this store to finish (gluon_mla).
    release_next_kernel(RELEASE)
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < row
    slot = tl.load(Loc + t).to(tl.int64)
    k = tl.load(K + t * stride_kt + offs, mask=mask)
    tl.store(KCache + slot * row + offs, k.to(KCache.dtype.element_ty), mask=mask)
    if HAS_V:
        v = tl.load(V + t * stride_vt + offs, mask=mask)
        tl.store(VCache + slot * row + offs, v.to(VCache.dtype.element_ty), mask=mask)


_STORE_KV = CachedKernel(_store_kv_kernel)


def store_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor | None, loc: torch.Tensor, k: torch.Tensor,
    v: torch.Tensor | None,
) -> None:
    """k_cache[loc[i]] = k[i] (and v_cache likewise) for each token i.

    Caches are [slots, *row_shape], contiguous; k and v are [tokens, *row_shape] with each
    token's row contiguous (any token stride). `v_cache` None: a latent pool, K alone.
    """
    if k.is_cuda:
        store_kv_triton(k_cache, v_cache, loc, k, v)
    else:
        _store_reference(k_cache, v_cache, loc, k, v)


def store_kv_triton(
    k_cache: torch.Tensor, v_cache: torch.Tensor | None, loc: torch.Tensor, k: torch.Tensor,
    v: torch.Tensor | None,
) -> None:
    """`store_kv`'s kernel, whatever the device (the CPU tests run it in Triton's interpreter)."""
    k, v = _rows(k, k_cache), (None if v is None else _rows(v, k_cache))
    row = k_cache[0].numel()
    grid = (k.shape[0], cdiv(row, STORE_BLOCK))
    _STORE_KV.launch(
        grid, k, v if v is not None else k, k_cache, v_cache if v_cache is not None else k_cache, loc,
        k.stride(0), v.stride(0) if v is not None else 0, row,
        HAS_V=v_cache is not None, BLOCK=STORE_BLOCK, RELEASE=dependent_launch(k.device)["PDL"], num_warps=4,
    )


def _rows(x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """`x` as [tokens, row] over the same memory when each token's row is contiguous."""
    flat = x.reshape(x.shape[0], -1) if x.dim() > 2 else x
    if flat.shape[1] != cache[0].numel() or flat.stride(-1) != 1:
        flat = flat.contiguous()
    return flat


def _store_reference(
    k_cache: torch.Tensor, v_cache: torch.Tensor | None, loc: torch.Tensor, k: torch.Tensor,
    v: torch.Tensor | None,
) -> None:
    # index_copy_ rather than `cache[loc] = k`: the same copy without advanced indexing's host work.
    loc = loc if loc.dtype == torch.int64 else loc.long()
    k_cache.index_copy_(0, loc, k)
    if v_cache is not None and v is not None:
        v_cache.index_copy_(0, loc, v)
