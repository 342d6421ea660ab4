"""Reference attention: gather each request's K/V through req_to_token and call SDPA.

Loops over requests on the host, so it is not capturable; it is the oracle the Triton
kernels are tested against and the backend that runs on the CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cgtool.attention.backend import HeadsBackend
from cgtool.runtime.batch import ForwardBatch
from cgtool.runtime.kv import KVPool


def attend_one_request(
    q: torch.Tensor,  # [new, heads, head_dim]
    k: torch.Tensor,  # [seq_len, kv_heads, head_dim]
    v: torch.Tensor,  # [seq_len, kv_heads, value_dim]
    prefix_len: int,
    scale: float,
) -> torch.Tensor:
    new, heads = q.shape[0], q.shape[1]
    group = heads // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    # Query i sits at position prefix_len + i and sees keys 0..prefix_len + i.
    q_pos = torch.arange(new, device=q.device)[:, None] + prefix_len
    mask = torch.arange(k.shape[0], device=q.device)[None, :] <= q_pos
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).float(), k.transpose(0, 1).float(), v.transpose(0, 1).float(),
        attn_mask=mask, scale=scale,
    )
    return out.transpose(0, 1).to(q.dtype)


class TorchAttentionBackend(HeadsBackend):
    name = "torch"

    def _decode(
        self, q: torch.Tensor, out: torch.Tensor, layer_id: int, batch: ForwardBatch, kv_pool: KVPool
    ) -> None:
        prefix_lens = [n - 1 for n in batch.seq_lens_cpu]
        self._attend(q, out, layer_id, batch, kv_pool, prefix_lens, [1] * batch.batch_size)

    def _extend(
        self, q: torch.Tensor, out: torch.Tensor, layer_id: int, batch: ForwardBatch, kv_pool: KVPool
    ) -> None:
        assert batch.extend_prefix_lens_cpu is not None and batch.extend_seq_lens_cpu is not None
        prefix_lens, new_lens = batch.extend_prefix_lens_cpu, batch.extend_seq_lens_cpu
        self._attend(q, out, layer_id, batch, kv_pool, prefix_lens, new_lens)

    def _attend(
        self, q: torch.Tensor, out: torch.Tensor, layer_id: int, batch: ForwardBatch, kv_pool: KVPool,
        prefix_lens: list[int], new_lens: list[int],
    ) -> None:
        req_rows = batch.req_pool_indices.tolist()
        start = 0
        for req, prefix, new in zip(req_rows, prefix_lens, new_lens):
            slots = kv_pool.req_to_token[req, : prefix + new].long()
            k = kv_pool.k_buffers[layer_id][slots]
            v = kv_pool.v_buffers[layer_id][slots][..., : kv_pool.value_dim]
            out[start : start + new] = attend_one_request(q[start : start + new], k, v, prefix, self.scale)
            start += new
        out[start:].zero_()  # padded tokens of a replayed graph
