"""The `triton` attention backend: split-KV decode and varlen extend kernels on the GPU."""

from __future__ import annotations

import torch

from cgtool.attention.triton_decode import decode_attention, decode_scratch, num_kv_splits_for
from cgtool.attention.triton_extend import extend_attention
from cgtool.batch import ForwardBatch
from cgtool.kv import KVPool


class TritonAttentionBackend:
    name = "triton"

    def __init__(self, num_heads: int, head_dim: int, num_kv_splits: int | None = None) -> None:
        """`num_kv_splits` (a power of two) overrides the choice by batch size."""
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.num_kv_splits = num_kv_splits
        self.scale = head_dim**-0.5

    def forward(
        self, q: torch.Tensor, out: torch.Tensor, layer_id: int, batch: ForwardBatch, kv_pool: KVPool
    ) -> None:
        q = q.view(q.shape[0], self.num_heads, self.head_dim)
        out = out.view(q.shape)
        k_cache, v_cache = kv_pool.k_buffers[layer_id], kv_pool.v_buffers[layer_id]
        if batch.forward_mode.is_decode():
            self._decode(q, out, k_cache, v_cache, batch, kv_pool)
        else:
            self._extend(q, out, k_cache, v_cache, batch, kv_pool)

    def _decode(
        self, q: torch.Tensor, out: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
        batch: ForwardBatch, kv_pool: KVPool,
    ) -> None:
        # Tensors only, no host reads: this runs inside captured decode graphs. The scratch
        # is taken per call; inside a capture it comes from the graph pool, where every layer
        # (and every graph of the shared pool) reuses the same block.
        bs = q.shape[0]
        splits = self.num_kv_splits or num_kv_splits_for(bs, k_cache.shape[1])
        mid_out, mid_lse = decode_scratch(bs, self.num_heads, self.head_dim, splits, q.device)
        decode_attention(
            q, k_cache, v_cache, out, kv_pool.req_to_token, batch.req_pool_indices,
            batch.seq_lens, self.scale, mid_out, mid_lse,
        )

    def _extend(
        self, q: torch.Tensor, out: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
        batch: ForwardBatch, kv_pool: KVPool,
    ) -> None:
        # Extend attention runs eagerly between piecewise graph pieces, so host-side lengths
        # may size the grid.
        assert batch.extend_seq_lens_cpu is not None and batch.extend_seq_lens is not None
        assert batch.extend_prefix_lens is not None and batch.extend_start_loc is not None
        new_lens = batch.extend_seq_lens_cpu
        extend_attention(
            q, k_cache, v_cache, out, kv_pool.req_to_token, batch.req_pool_indices,
            batch.extend_prefix_lens, batch.extend_seq_lens, batch.extend_start_loc, self.scale,
            max_extend_len=max(new_lens, default=0), num_real_tokens=sum(new_lens),
        )
