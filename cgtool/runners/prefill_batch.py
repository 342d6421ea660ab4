"""The batch both prefill runners (piecewise, breakable) warm up and record on."""

from __future__ import annotations

import torch

from cgtool.runtime.batch import ForwardBatch, ForwardMode
from cgtool.runtime.kv import DUMMY_REQ, DUMMY_SLOT


def dummy_extend_batch(
    num_tokens: int, input_ids: torch.Tensor, positions: torch.Tensor, out_cache_loc: torch.Tensor,
    max_context_len: int,
) -> ForwardBatch:
    """`num_tokens` tokens of the static buffers on the dummy request row, in requests no longer
    than the context. Row 0 of req_to_token is never handed out, so every key read and every K/V
    written during warm-up and capture lands in the dummy slot."""
    lens = [min(max_context_len, num_tokens - start) for start in range(0, num_tokens, max_context_len)]
    device = input_ids.device
    starts = [sum(lens[:i]) for i in range(len(lens))]
    out_cache_loc[:num_tokens].fill_(DUMMY_SLOT)
    return ForwardBatch(
        forward_mode=ForwardMode.EXTEND,
        batch_size=len(lens),
        input_ids=input_ids[:num_tokens],
        positions=positions[:num_tokens],
        req_pool_indices=torch.full((len(lens),), DUMMY_REQ, dtype=torch.int64, device=device),
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=device),
        out_cache_loc=out_cache_loc[:num_tokens],
        seq_lens_cpu=lens,
        extend_prefix_lens=torch.zeros(len(lens), dtype=torch.int32, device=device),
        extend_seq_lens=torch.tensor(lens, dtype=torch.int32, device=device),
        extend_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        extend_prefix_lens_cpu=[0] * len(lens),
        extend_seq_lens_cpu=lens,
    )
