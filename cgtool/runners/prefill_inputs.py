"""The static inputs both prefill runners (piecewise, breakable) record from, the dummy batch
they warm up and record on, and their capture loop."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from cgtool.runners.pitfalls import StaticInputs
from cgtool.runners.pool import SizeStep, freeze_gc, just_record
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


class PrefillStaticTokens:
    """The token buffers a prefill runner's graphs read in place (up to its `max_num_tokens`),
    and the capture loop over its token counts, for a runner with `model_runner`,
    `max_num_tokens`, `capture_num_tokens`, `captured_num_tokens` and `enable_cudagraph_gc` set
    that defines `warmup` and `_record`."""

    model_runner: Any
    max_num_tokens: int
    capture_num_tokens: list[int]
    captured_num_tokens: list[int]
    enable_cudagraph_gc: bool
    warmed_up: bool

    def warmup(self) -> None:
        raise NotImplementedError

    def _record(self, num_tokens: int) -> None:
        raise NotImplementedError

    def capture(self, step: SizeStep = just_record) -> None:
        """Record each token count, largest first as DecodeGraphRunner.capture does and under its
        GC freeze; warms up (compiles, for the piecewise runner) first if `warmup` has not run."""
        if not self.warmed_up:
            self.warmup()
        with freeze_gc(self.enable_cudagraph_gc):
            for index, num_tokens in enumerate(reversed(self.capture_num_tokens)):
                if not step(index, num_tokens, partial(self._record, num_tokens)):
                    break

    def drop_size(self, num_tokens: int) -> None:
        """Never replay `num_tokens` (with TP, a peer failed to record it). Its graphs stay alive:
        they share the pool that smaller sizes are captured into."""
        if num_tokens in self.captured_num_tokens:
            self.captured_num_tokens.remove(num_tokens)

    def _allocate_static_tokens(self) -> None:
        with torch.device(self.model_runner.device):
            self.input_ids = torch.zeros((self.max_num_tokens,), dtype=torch.int64)
            self.positions = torch.zeros((self.max_num_tokens,), dtype=torch.int64)
            self.out_cache_loc = torch.full((self.max_num_tokens,), DUMMY_SLOT, dtype=torch.int64)
        self.static_inputs = StaticInputs(**self._buffers())

    @property
    def static_buffer_bytes(self) -> int:
        """Inputs the graphs read in place, allocated outside the pool."""
        return sum(t.numel() * t.element_size() for t in self._buffers().values())

    def _buffers(self) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids, "positions": self.positions, "out_cache_loc": self.out_cache_loc}

    def static_batch(self, num_tokens: int) -> ForwardBatch:
        """`num_tokens` tokens of the static buffers on the dummy request row."""
        return dummy_extend_batch(num_tokens, self.input_ids, self.positions, self.out_cache_loc,
                                  self.model_runner.kv_pool.max_context_len)
