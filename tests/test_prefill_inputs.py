"""The static token buffers both prefill runners record from, and their dummy extend batch."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from cgtool.runners.pitfalls import CapturePitfall
from cgtool.runners.prefill_inputs import PrefillStaticTokens, dummy_extend_batch
from cgtool.runtime.batch import ForwardMode
from cgtool.runtime.kv import DUMMY_REQ, DUMMY_SLOT


def test_tokens_are_split_into_requests_no_longer_than_the_context():
    input_ids, positions = torch.arange(16), torch.arange(16) * 2
    out_cache_loc = torch.arange(16) + 100
    batch = dummy_extend_batch(11, input_ids, positions, out_cache_loc, max_context_len=4)
    assert batch.forward_mode == ForwardMode.EXTEND and batch.batch_size == 3
    assert batch.seq_lens_cpu == batch.extend_seq_lens_cpu == [4, 4, 3]
    assert batch.extend_start_loc.tolist() == [0, 4, 8] and batch.extend_prefix_lens_cpu == [0, 0, 0]
    assert batch.req_pool_indices.tolist() == [DUMMY_REQ] * 3
    # The batch reads the runner's static buffers themselves (a graph records their addresses).
    assert batch.input_ids.data_ptr() == input_ids.data_ptr() and batch.input_ids.numel() == 11
    assert batch.positions.data_ptr() == positions.data_ptr()
    # Every token of the batch writes the dummy slot; the buffer past it is left alone.
    assert out_cache_loc[:11].tolist() == [DUMMY_SLOT] * 11 and out_cache_loc[11:].tolist() == [111, 112, 113, 114, 115]


def test_a_batch_within_the_context_is_one_request():
    buffers = (torch.zeros(8, dtype=torch.int64), torch.zeros(8, dtype=torch.int64), torch.zeros(8, dtype=torch.int64))
    batch = dummy_extend_batch(8, *buffers, max_context_len=4096)
    assert batch.batch_size == 1 and batch.seq_lens.tolist() == [8] and batch.extend_start_loc.tolist() == [0]


class _Runner(PrefillStaticTokens):
    def __init__(self, max_num_tokens: int, max_context_len: int) -> None:
        self.model_runner = SimpleNamespace(device=torch.device("cpu"),
                                            kv_pool=SimpleNamespace(max_context_len=max_context_len))
        self.max_num_tokens = max_num_tokens
        self._allocate_static_tokens()


def test_a_runner_s_static_tokens_are_its_batches_buffers_and_are_watched():
    runner = _Runner(max_num_tokens=12, max_context_len=5)
    assert runner.static_buffer_bytes == 3 * 12 * 8  # three int64 buffers of 12 tokens
    assert runner.out_cache_loc.tolist() == [DUMMY_SLOT] * 12
    batch = runner.static_batch(7)
    assert batch.seq_lens_cpu == [5, 2] and batch.input_ids.data_ptr() == runner.input_ids.data_ptr()
    runner.static_inputs.check(**runner._buffers())  # the addresses the graphs record
    runner.input_ids = torch.zeros(12, dtype=torch.int64)
    with pytest.raises(CapturePitfall, match="input_ids"):
        runner.static_inputs.check(**runner._buffers())
