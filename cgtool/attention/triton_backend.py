"""The `triton` attention backend: split-KV decode and varlen extend kernels on the GPU.

Over a latent pool (MLA) it runs cgtool.attention.triton_mla's kernels, which read each
latent row once as the key and value of every head; the pool, not the caller, says which."""

from __future__ import annotations

import torch

from cgtool.attention.backend import HeadsBackend
from cgtool.attention.mla_merge_projection import decode_projected
from cgtool.attention.triton_decode import decode_attention
from cgtool.attention.triton_extend import extend_attention
from cgtool.attention.triton_mla import (
    mla_decode_attention,
    mla_extend_attention,
    mla_num_kv_splits,
)
from cgtool.runtime.batch import ForwardBatch, forward_memo, forward_scratch
from cgtool.runtime.kv import KVPool


class TritonAttentionBackend(HeadsBackend):
    name = "triton"

    def __init__(
        self, num_heads: int, head_dim: int, num_kv_splits: int | None = None, chunks: int | None = None,
    ) -> None:
        """Overrides, for tests and benchmarks: `num_kv_splits` (a power of two), MLA's chunks
        a request; `chunks`, the chunks a KV head a dense decode step aims for."""
        super().__init__(num_heads, head_dim)
        self.num_kv_splits = num_kv_splits
        self.chunks = chunks

    def forward_projected(
        self, q: torch.Tensor, w_uv: torch.Tensor, out: torch.Tensor, layer_id: int, batch: ForwardBatch,
        kv_pool: KVPool,
    ) -> bool:
        """Decode over a latent pool where mla_merge_projection serves: the chunks merged in the
        value projection's kernel."""
        if not (kv_pool.is_latent and batch.forward_mode.is_decode()):
            return False
        q = q.view(q.shape[0], self.num_heads, self.head_dim)
        # Its chunks are gluon_mla_wgmma's flat shares of the batch's keys: num_kv_splits, a
        # test's override of the grid's count, does not bear on them.
        return decode_projected(
            q, kv_pool.k_buffers[layer_id], w_uv, out, kv_pool.req_to_token, batch.req_pool_indices,
            batch.seq_lens, self.scale, _scratch(q), memo=forward_memo(),
        )

    def _decode(
        self, q: torch.Tensor, out: torch.Tensor, layer_id: int, batch: ForwardBatch, kv_pool: KVPool
    ) -> None:
        # Tensors only, no host reads: this runs inside captured decode graphs.
        bs, k_cache = q.shape[0], kv_pool.k_buffers[layer_id]
        scratch = _scratch(q)
        if kv_pool.is_latent:
            splits = self.num_kv_splits or mla_num_kv_splits(bs, self.num_heads)
            mla_decode_attention(
                q, k_cache, out, kv_pool.req_to_token, batch.req_pool_indices, batch.seq_lens,
                self.scale, splits, scratch, memo=forward_memo(),
            )
            return
        decode_attention(
            q, k_cache, kv_pool.v_buffers[layer_id], out, kv_pool.req_to_token,
            batch.req_pool_indices, batch.seq_lens, self.scale, self.chunks, scratch, forward_memo(),
        )

    def _extend(
        self, q: torch.Tensor, out: torch.Tensor, layer_id: int, batch: ForwardBatch, kv_pool: KVPool
    ) -> None:
        # Extend runs eagerly between piecewise graph pieces, so host-side lengths may size
        # the grid.
        new_lens = batch.extend_seq_lens_cpu
        assert new_lens is not None and batch.extend_seq_lens is not None
        assert batch.extend_prefix_lens is not None and batch.extend_start_loc is not None
        out[sum(new_lens) :].zero_()  # the padding of a replayed piecewise graph
        max_extend_len = max(new_lens, default=0)
        if max_extend_len == 0:
            return
        lens = (batch.extend_prefix_lens, batch.extend_seq_lens, batch.extend_start_loc)
        k_cache = kv_pool.k_buffers[layer_id]
        # A step of few programs over long prefixes splits its keys (triton_extend): its
        # longest request's keys, and the real rows for the merge to stop at.
        prefixes = batch.extend_prefix_lens_cpu or [0] * len(new_lens)
        split = {"longest_keys": max((p + n for p, n in zip(prefixes, new_lens)), default=0),
                 "new_tokens": sum(new_lens)}
        if kv_pool.is_latent:
            mla_extend_attention(
                q, k_cache, out, kv_pool.req_to_token, batch.req_pool_indices, *lens,
                self.scale, max_extend_len, **split,
            )
            return
        extend_attention(
            q, k_cache, kv_pool.v_buffers[layer_id], out, kv_pool.req_to_token,
            batch.req_pool_indices, *lens, self.scale, max_extend_len, **split,
        )


def _scratch(q: torch.Tensor) -> dict[object, object] | None:
    """The split buffers' workspace: a forward's layers share it when eager (an allocation a
    layer is host time); a capture keeps allocating per layer, whose blocks the pool reuses at
    once, since a block held across the forward grew the pool (92 to 126 MiB, 36 sizes, 8B)."""
    capturing = q.is_cuda and torch.cuda.is_current_stream_capturing()
    return None if capturing else forward_scratch()
