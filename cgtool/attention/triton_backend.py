"""The `triton` attention backend: split-KV decode and varlen extend kernels on the GPU.

Over a latent pool (MLA) it runs cgtool.attention.triton_mla's kernels, which read each
latent row once as the key and value of every head; the pool, not the caller, says which."""

from __future__ import annotations

import torch

from cgtool.attention.triton_decode import decode_attention, decode_scratch, num_kv_splits_for
from cgtool.attention.triton_extend import extend_attention
from cgtool.attention.triton_mla import BLOCK_H, mla_decode_attention, mla_extend_attention
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
        out = out.view(q.shape[0], self.num_heads, kv_pool.value_dim)
        k_cache, v_cache = kv_pool.k_buffers[layer_id], kv_pool.v_buffers[layer_id]
        if kv_pool.is_latent:
            self._latent(q, out, k_cache, batch, kv_pool)
        elif batch.forward_mode.is_decode():
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

    def _latent(
        self, q: torch.Tensor, out: torch.Tensor, latent_cache: torch.Tensor, batch: ForwardBatch,
        kv_pool: KVPool,
    ) -> None:
        if batch.forward_mode.is_decode():
            bs = q.shape[0]
            head_blocks = -(-self.num_heads // BLOCK_H)
            splits = self.num_kv_splits or num_kv_splits_for(bs, head_blocks)
            mid_out, mid_lse = decode_scratch(bs, self.num_heads, kv_pool.value_dim, splits, q.device)
            mla_decode_attention(
                q, latent_cache, out, kv_pool.req_to_token, batch.req_pool_indices,
                batch.seq_lens, self.scale, mid_out, mid_lse,
            )
            return
        lens = self._extend_lens(batch)
        mla_extend_attention(
            q, latent_cache, out, kv_pool.req_to_token, batch.req_pool_indices, *lens[:3],
            self.scale, max_extend_len=lens[3], num_real_tokens=lens[4],
        )

    @staticmethod
    def _extend_lens(
        batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int]:
        """(prefix lens, new lens, start locs, the longest new part, new tokens in all).

        Extend attention runs eagerly between piecewise graph pieces, so host-side lengths
        may size the grid."""
        assert batch.extend_seq_lens_cpu is not None and batch.extend_seq_lens is not None
        assert batch.extend_prefix_lens is not None and batch.extend_start_loc is not None
        new_lens = batch.extend_seq_lens_cpu
        return (
            batch.extend_prefix_lens, batch.extend_seq_lens, batch.extend_start_loc,
            max(new_lens, default=0), sum(new_lens),
        )

    def _extend(
        self, q: torch.Tensor, out: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
        batch: ForwardBatch, kv_pool: KVPool,
    ) -> None:
        lens = self._extend_lens(batch)
        extend_attention(
            q, k_cache, v_cache, out, kv_pool.req_to_token, batch.req_pool_indices, *lens[:3],
            self.scale, max_extend_len=lens[3], num_real_tokens=lens[4],
        )
