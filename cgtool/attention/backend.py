"""What the attention backends share: the layer's heads, the softmax scale, and the split
of every forward into decode or extend over the viewed q and out."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from cgtool.runtime.batch import ForwardBatch
from cgtool.runtime.kv import KVPool


class HeadsBackend(ABC):
    name: str

    def __init__(self, num_heads: int, head_dim: int) -> None:
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5

    def forward(
        self, q: torch.Tensor, out: torch.Tensor, layer_id: int, batch: ForwardBatch, kv_pool: KVPool
    ) -> None:
        """q [num_tokens, heads * head_dim]; out [num_tokens, heads * value_dim], written in place."""
        q = q.view(q.shape[0], self.num_heads, self.head_dim)
        out = out.view(q.shape[0], self.num_heads, kv_pool.value_dim)
        if batch.forward_mode.is_decode():
            self._decode(q, out, layer_id, batch, kv_pool)
        else:
            self._extend(q, out, layer_id, batch, kv_pool)

    def forward_projected(
        self, q: torch.Tensor, w_uv: torch.Tensor, out: torch.Tensor, layer_id: int, batch: ForwardBatch,
        kv_pool: KVPool,
    ) -> bool:
        """Attention over a latent pool with the heads' value projection in the same kernels:
        q [tokens, heads * head_dim], w_uv [heads, v, value_dim], out [tokens, heads * v].
        False, having launched nothing, where this backend has no such path for the batch."""
        return False

    @abstractmethod
    def _decode(
        self, q: torch.Tensor, out: torch.Tensor, layer_id: int, batch: ForwardBatch, kv_pool: KVPool
    ) -> None:
        """One new token per request; q [bs, heads, head_dim], out [bs, heads, value_dim]."""

    @abstractmethod
    def _extend(
        self, q: torch.Tensor, out: torch.Tensor, layer_id: int, batch: ForwardBatch, kv_pool: KVPool
    ) -> None:
        """Each request's new tokens, packed; rows past them are a replayed graph's padding."""
