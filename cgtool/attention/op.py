"""The attention custom op: stores new K/V at out_cache_loc, writes into a caller's buffer.

Being an opaque custom op makes it the place where piecewise graphs split; writing into
`out`, allocated by the caller, keeps every address stable across graph replays.
"""

from __future__ import annotations

from typing import Protocol

import torch

from cgtool.runtime.batch import ForwardBatch, get_forward_context
from cgtool.runtime.kv import KVPool


class AttentionBackend(Protocol):
    name: str

    def forward(
        self, q: torch.Tensor, out: torch.Tensor, layer_id: int, batch: ForwardBatch, kv_pool: KVPool
    ) -> None: ...

    def forward_projected(
        self, q: torch.Tensor, w_uv: torch.Tensor, out: torch.Tensor, layer_id: int, batch: ForwardBatch,
        kv_pool: KVPool,
    ) -> bool: ...


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, layer_id: int
) -> None:
    """q/out: [num_tokens, heads * head_dim]; k/v: [num_tokens, kv_heads * head_dim].

    Under torch.compile this is the custom op, the split point of piecewise graphs; eager
    code (and the attention pieces between graphs) call the implementation directly, since
    the custom op's dispatch costs far more host time than the kernels take."""
    if torch.compiler.is_compiling():
        torch.ops.cgtool.attention(q, k, v, out, layer_id)
    else:
        attention_impl(q, k, v, out, layer_id)


def stores_with_rope(q: torch.Tensor) -> bool:
    """Whether this layer's new K/V can be written by the rope kernel (fused.apply_rope_and_store)
    rather than by the attention op: eager code on the GPU over a K/V pool of q's dtype. Under
    torch.compile the store stays in the op, which runs between piecewise graphs with the
    batch's real slots; a latent pool (MLA) stores its own row."""
    if not q.is_cuda or torch.compiler.is_compiling():
        return False
    pool = get_forward_context().kv_pool
    return not pool.is_latent and pool.k_buffers[0].dtype == q.dtype


def attention_over_stored(q: torch.Tensor, out: torch.Tensor, layer_id: int) -> None:
    """`attention` for a layer whose new K/V are already in the pool."""
    ctx = get_forward_context()
    ctx.backend.forward(q, out, layer_id, ctx.batch, ctx.kv_pool)


def attention_impl(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, layer_id: int
) -> None:
    ctx = get_forward_context()
    _store(k, v, layer_id)
    ctx.backend.forward(q, out, layer_id, ctx.batch, ctx.kv_pool)


def latent_attention(
    q: torch.Tensor, latent: torch.Tensor, out_latent: torch.Tensor, w_uv: torch.Tensor, out: torch.Tensor,
    layer_id: int,
) -> bool:
    """`attention(q, latent, latent, out_latent, layer_id)` over a latent pool, eager code only.
    Where the backend runs the heads' value projection in the same kernels (its
    `forward_projected`), it writes out [tokens, heads * v] instead, each head's output times
    w_uv[head] ([heads, v, value_dim]), and returns True; else out_latent, and False."""
    ctx = get_forward_context()
    _store(latent, latent, layer_id)
    if ctx.backend.forward_projected(q, w_uv, out, layer_id, ctx.batch, ctx.kv_pool):
        return True
    ctx.backend.forward(q, out_latent, layer_id, ctx.batch, ctx.kv_pool)
    return False


def _store(k: torch.Tensor, v: torch.Tensor, layer_id: int) -> None:
    """The step's new K/V rows into the pool at the batch's out_cache_loc."""
    ctx = get_forward_context()
    pool = ctx.kv_pool
    kv_shape = (k.shape[0], *pool.k_buffers[layer_id].shape[1:])
    pool.store(layer_id, ctx.batch.out_cache_loc, k.view(kv_shape), v.view(kv_shape))


@torch.library.custom_op("cgtool::attention", mutates_args=("out",))
def _attention_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, layer_id: int
) -> None:
    attention_impl(q, k, v, out, layer_id)


@_attention_op.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, layer_id: int) -> None:
    return None


ATTENTION_OP = torch.ops.cgtool.attention.default


def make_backend(name: str, num_heads: int, head_dim: int) -> AttentionBackend:
    if name == "torch":
        from cgtool.attention.torch_ref import TorchAttentionBackend

        return TorchAttentionBackend(num_heads, head_dim)
    if name == "triton":
        from cgtool.attention.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend(num_heads, head_dim)
    raise ValueError(f"unknown attention backend {name!r}")
