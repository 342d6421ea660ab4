"""Triton varlen extend attention against the torch reference backend.

Runs in Triton's interpreter without a GPU (see test_triton_decode.py); bf16 on the GPU.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from test_triton_decode import assert_attention_close, random_pool, random_q

from cgtool.attention.torch_ref import TorchAttentionBackend
from cgtool.attention.triton_backend import TritonAttentionBackend
from cgtool.runtime.engine import extend_batch
from cgtool.runtime.kv import KVPool


def run_extend(
    pool: KVPool, rows: list[int], prefix_lens: list[int], new_lens: list[int],
    num_heads: int, head_dim: int, num_padding: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(triton output, reference output) for one extend batch padded by `num_padding` tokens."""
    device = str(pool.req_to_token.device)
    batch = extend_batch(pool, rows, prefix_lens, [[0] * n for n in new_lens])
    q = random_q(sum(new_lens) + num_padding, num_heads, head_dim, pool.k_buffers[0].dtype, device)
    out, ref = torch.full_like(q, float("nan")), torch.full_like(q, float("nan"))
    TritonAttentionBackend(num_heads, head_dim).forward(q, out, 0, batch, pool)
    TorchAttentionBackend(num_heads, head_dim).forward(q, ref, 0, batch, pool)
    return out, ref


@pytest.mark.parametrize(("num_heads", "kv_heads", "head_dim"), [(4, 4, 64), (8, 2, 64), (4, 1, 128)])
def test_extend_matches_reference_for_mixed_prefixes(num_heads, kv_heads, head_dim):
    # 130 new tokens span two query blocks of 128; prefixes 0, 3 and 70 are not block-aligned.
    prefix_lens, new_lens = [0, 70, 3, 0], [130, 1, 20, 1]
    capacities = [p + n for p, n in zip(prefix_lens, new_lens)]
    pool, rows = random_pool(capacities, num_heads, kv_heads, head_dim, torch.float32, "cpu")
    out, ref = run_extend(pool, rows, prefix_lens, new_lens, num_heads, head_dim)
    assert_attention_close(out, ref, atol=1e-4)


def test_extend_padding_rows_are_zero_and_harmless():
    prefix_lens, new_lens = [5, 0], [9, 3]
    pool, rows = random_pool([14, 3], 4, 2, 64, torch.float32, "cpu")
    out, ref = run_extend(pool, rows, prefix_lens, new_lens, 4, 64, num_padding=5)
    assert out[12:].eq(0).all()
    assert_attention_close(out, ref, atol=1e-4)


def test_extend_matches_reference_in_fp16():
    prefix_lens, new_lens = [40, 0], [25, 60]
    pool, rows = random_pool([65, 60], 8, 2, 64, torch.float16, "cpu")
    out, ref = run_extend(pool, rows, prefix_lens, new_lens, 8, 64, num_padding=3)
    assert_attention_close(out, ref, atol=5e-3)


def run_extend_split(pool, rows, prefix_lens, new_lens, num_heads, head_dim, kv_splits, num_padding=0, heads=None):
    """(triton output with each program's keys split `kv_splits` ways and `heads` q heads a
    program, reference output)."""
    from cgtool.attention.triton_extend import extend_attention

    device = str(pool.req_to_token.device)
    batch = extend_batch(pool, rows, prefix_lens, [[0] * n for n in new_lens])
    q = random_q(sum(new_lens) + num_padding, num_heads, head_dim, pool.k_buffers[0].dtype, device)
    out, ref = torch.zeros_like(q), torch.full_like(q, float("nan"))
    shape = (q.shape[0], num_heads, head_dim)
    extend_attention(
        q.view(shape), pool.k_buffers[0], pool.v_buffers[0], out.view(shape), pool.req_to_token, batch.req_pool_indices,
        batch.extend_prefix_lens, batch.extend_seq_lens, batch.extend_start_loc, head_dim**-0.5,
        max(new_lens), new_tokens=sum(new_lens), kv_splits=kv_splits, heads=heads,
    )
    TorchAttentionBackend(num_heads, head_dim).forward(q, ref, 0, batch, pool)
    return out, ref


@pytest.mark.parametrize("kv_splits", [2, 3, 7])
@pytest.mark.parametrize("largest_new", [130, 40])  # 128-row query blocks; blocks of 64 (SMALL_EXTEND)
def test_extend_with_split_keys_matches_reference(kv_splits, largest_new):
    # Prefixes from none to 900 keys: some chunks are empty (prefix 0 and 3); a request of 130
    # new tokens spans two query blocks whose causal tails fall in the last chunk alone.
    prefix_lens, new_lens = [0, 900, 3, 200, 517], [largest_new, 1, 20, 33, 7]
    capacities = [p + n for p, n in zip(prefix_lens, new_lens)]
    pool, rows = random_pool(capacities, 8, 2, 64, torch.float32, "cpu")
    out, ref = run_extend_split(pool, rows, prefix_lens, new_lens, 8, 64, kv_splits, num_padding=4)
    assert not out.isnan().any()
    assert out[sum(new_lens):].eq(0).all()  # the merge leaves the padding rows alone
    assert_attention_close(out, ref, atol=1e-4)


def test_a_step_splits_its_keys_only_when_its_programs_leave_sms_idle():
    from cgtool.attention.triton_extend import MIN_SPLIT_KEYS, extend_kv_splits

    assert extend_kv_splits(programs=32, longest_keys=24_590, sms=132) == 9  # 2 x 132 / 32, rounded up
    assert extend_kv_splits(programs=32, longest_keys=3 * MIN_SPLIT_KEYS, sms=132) == 3  # keys to share
    assert extend_kv_splits(programs=32, longest_keys=500, sms=132) == 1
    assert extend_kv_splits(programs=132, longest_keys=100_000, sms=132) == 1  # a full wave already


# ---------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize(("num_heads", "kv_heads", "head_dim"), [(16, 16, 64), (32, 8, 128), (16, 2, 128)])
def test_extend_bf16_matches_reference_for_long_prefixes(num_heads, kv_heads, head_dim):
    prefix_lens = [0, 8192, 1000, 7000, 0, 300]
    new_lens = [4096, 1, 1500, 700, 1, 129]
    capacities = [p + n for p, n in zip(prefix_lens, new_lens)]
    pool, rows = random_pool(capacities, num_heads, kv_heads, head_dim, torch.bfloat16, "cuda")
    out, ref = run_extend(pool, rows, prefix_lens, new_lens, num_heads, head_dim, num_padding=61)
    assert out[sum(new_lens):].eq(0).all()
    assert_attention_close(out, ref, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize(("prefix", "new"), [(24_576, 14), (12_546, 1), (8192, 300)])
def test_extend_bf16_over_a_long_prefix_splits_its_keys_and_matches_reference(prefix, new):
    # qwen3-30b-a3b's attention shape: a few new tokens over a long prefix, as the backend runs
    # them (its split chosen from the SM count), against the torch reference.
    pool, rows = random_pool([prefix + new, 40], 32, 4, 128, torch.bfloat16, "cuda")
    out, ref = run_extend(pool, rows, [prefix, 0], [new, 40], 32, 128, num_padding=9)
    assert out[new + 40:].eq(0).all()
    assert_attention_close(out, ref, atol=2e-2)


@pytest.mark.parametrize("kv_splits", [1, 3])
@pytest.mark.parametrize(("heads", "new_lens"), [(2, [1, 20, 33, 7]), (4, [1, 3, 1, 2]), (4, [17, 1, 5, 9])])
def test_extend_with_heads_as_rows_matches_reference(heads, new_lens, kv_splits):
    # 8 q heads over 2 KV heads: a program takes `heads` heads of one group for each of its
    # tokens. 33 new tokens at 4 heads fill two 64-row blocks and a part; 3 at 4 heads fill a
    # 16-row block and leave rows of no token; the causal tail crosses tokens of one block.
    prefix_lens = [0, 900, 3, 200]
    capacities = [p + n for p, n in zip(prefix_lens, new_lens)]
    pool, rows = random_pool(capacities, 8, 2, 64, torch.float32, "cpu")
    out, ref = run_extend_split(pool, rows, prefix_lens, new_lens, 8, 64, kv_splits, num_padding=4, heads=heads)
    assert not out.isnan().any()
    assert out[sum(new_lens):].eq(0).all()
    assert_attention_close(out, ref, atol=1e-4)


def test_a_small_step_takes_a_gqa_groups_heads_as_rows_and_splits_its_keys_finer():
    from cgtool.attention.triton_extend import HEADS_MIN_SPLIT_KEYS, MAX_KV_SPLITS, extend_launch

    # (q heads a program, block rows, query blocks a request, key splits) on a 132-SM GPU
    # qwen3-30b-a3b: 32 q heads over 4 KV heads, groups of 8
    assert extend_launch(32, 8, 1, 1, 12_547, 132, 128) == (8, 16, 1, 49)  # 4 programs, chunks of 256 keys
    assert extend_launch(32, 8, 1, 14, 24_590, 132, 128) == (8, 64, 2, 33)  # 8 tokens a block; 2 x 132 / 8
    assert extend_launch(32, 8, 1, 300, 8_492, 132, 128) == (1, 128, 3, 3)  # past SMALL_EXTEND: as before
    # llama-3.1-8b: groups of 4; a group of 6 takes 2 heads (the largest power of two in it)
    assert extend_launch(32, 4, 2, 40, 900, 132, 128)[:3] == (4, 64, 3)
    assert extend_launch(12, 6, 1, 1, 100, 132, 128)[0] == 2
    # MLA: all 16 heads share the latent head
    assert extend_launch(16, 16, 1, 1, 12_547, 132, 64) == (16, 16, 1, 12_547 // HEADS_MIN_SPLIT_KEYS)
    assert extend_launch(16, 16, 1, 14, 24_590, 132, 64) == (16, 64, 4, 64)  # 4 tokens a block
    # a full wave needs no split; overrides are kept
    assert extend_launch(32, 8, 64, 64, 70_000, 132, 128)[3] == 1
    assert extend_launch(32, 8, 1, 1, 12_547, 132, 128, heads=1, kv_splits=5) == (1, 16, 1, 5)
    # a block given (a benchmark's tiles): blocks and splits follow it, not the block it replaced
    assert extend_launch(16, 16, 1, 2048, 6_144, 132, 64, heads=1, block_m=32) == (1, 32, 64, 1)
    assert extend_launch(16, 16, 1, 100, 8_192, 132, 64, heads=1, block_m=32)[2:] == (4, 5)  # 264 / 64 programs
    assert extend_launch(16, 16, 1, 1, 100_000, 132, 64)[3] == MAX_KV_SPLITS
