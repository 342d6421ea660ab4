"""Eager forward over the KV pool, and builders for extend and decode batches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from cgtool.model.llama import CausalLM
from cgtool.runtime.batch import ForwardBatch, ForwardMode, forward_context
from cgtool.runtime.kv import KVPool


@dataclass(slots=True)
class ModelRunner:
    """The model, its KV pool and its attention backend: what every graph runner wraps."""

    model: CausalLM
    kv_pool: KVPool
    backend: object

    @property
    def device(self) -> torch.device:
        return self.kv_pool.req_to_token.device

    def forward_eager(self, batch: ForwardBatch) -> torch.Tensor:
        """Hidden states of every token of the batch: [num_tokens, hidden]."""
        with forward_context(batch, self.kv_pool, self.backend, share_scratch=True):
            return self.model(batch.input_ids, batch.positions)


def extend_batch(
    pool: KVPool,
    req_rows: Sequence[int],
    prefix_lens: Sequence[int],
    new_token_ids: Sequence[Sequence[int]],
) -> ForwardBatch:
    """Each request already holds `prefix_len` tokens in the pool and adds its new tokens."""
    device = pool.req_to_token.device
    new_lens = [len(t) for t in new_token_ids]
    positions = torch.cat([torch.arange(p, p + n) for p, n in zip(prefix_lens, new_lens)])
    rows = torch.repeat_interleave(torch.tensor(list(req_rows)), torch.tensor(new_lens))
    starts = torch.tensor([0] + new_lens[:-1]).cumsum(0)
    seq_lens = [p + n for p, n in zip(prefix_lens, new_lens)]
    return ForwardBatch(
        forward_mode=ForwardMode.EXTEND,
        batch_size=len(req_rows),
        input_ids=torch.tensor([t for ids in new_token_ids for t in ids], device=device),
        positions=positions.to(device),
        req_pool_indices=torch.tensor(list(req_rows), device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        out_cache_loc=pool.req_to_token[rows.to(device), positions.to(device)].long(),
        seq_lens_cpu=seq_lens,
        extend_prefix_lens=torch.tensor(list(prefix_lens), dtype=torch.int32, device=device),
        extend_seq_lens=torch.tensor(new_lens, dtype=torch.int32, device=device),
        extend_start_loc=starts.to(device=device, dtype=torch.int32),
        extend_prefix_lens_cpu=list(prefix_lens),
        extend_seq_lens_cpu=new_lens,
    )


def decode_batch(
    pool: KVPool, req_rows: Sequence[int], seq_lens_before: Sequence[int], token_ids: Sequence[int]
) -> ForwardBatch:
    """One new token per request, at position `seq_len_before`."""
    device = pool.req_to_token.device
    positions = torch.tensor(list(seq_lens_before), device=device)
    rows = torch.tensor(list(req_rows), device=device)
    seq_lens = [n + 1 for n in seq_lens_before]
    return ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=len(req_rows),
        input_ids=torch.tensor(list(token_ids), device=device),
        positions=positions,
        req_pool_indices=rows,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        out_cache_loc=pool.req_to_token[rows, positions].long(),
        seq_lens_cpu=seq_lens,
    )
