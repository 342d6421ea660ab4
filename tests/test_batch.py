import torch

from cgtool.runtime.batch import ForwardBatch, ForwardMode, forward_context, scratch_empty


def _batch() -> ForwardBatch:
    ids = torch.zeros(2, dtype=torch.long)
    return ForwardBatch(
        forward_mode=ForwardMode.DECODE, batch_size=2, input_ids=ids, positions=ids,
        req_pool_indices=ids, seq_lens=ids.int(), out_cache_loc=ids, seq_lens_cpu=[1, 1],
    )


def test_a_sharing_forward_hands_every_layer_the_same_block_per_name_and_shape():
    with forward_context(_batch(), kv_pool=None, backend=None, share_scratch=True):
        first = scratch_empty("silu_out", (2, 8), torch.float32, torch.device("cpu"))
        again = scratch_empty("silu_out", (2, 8), torch.float32, torch.device("cpu"))
        other_name = scratch_empty("rope_q", (2, 8), torch.float32, torch.device("cpu"))
        other_shape = scratch_empty("silu_out", (3, 8), torch.float32, torch.device("cpu"))
    assert again.data_ptr() == first.data_ptr()
    assert other_name.data_ptr() != first.data_ptr()
    assert other_shape.shape == (3, 8) and other_shape.data_ptr() != first.data_ptr()


def test_forwards_that_do_not_share_and_the_next_forward_get_new_tensors():
    with forward_context(_batch(), kv_pool=None, backend=None, share_scratch=True):
        kept = scratch_empty("silu_out", (2, 8), torch.float32, torch.device("cpu"))
    with forward_context(_batch(), kv_pool=None, backend=None, share_scratch=True):
        next_forward = scratch_empty("silu_out", (2, 8), torch.float32, torch.device("cpu"))
    with forward_context(_batch(), kv_pool=None, backend=None):  # a capture's forward
        a = scratch_empty("silu_out", (2, 8), torch.float32, torch.device("cpu"))
        b = scratch_empty("silu_out", (2, 8), torch.float32, torch.device("cpu"))
    outside = scratch_empty("silu_out", (2, 8), torch.float32, torch.device("cpu"))
    assert next_forward is not kept
    assert a is not b and outside.shape == (2, 8)
