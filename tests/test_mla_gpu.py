"""MLA on the GPU: the Triton latent kernels in bf16 against the torch reference at DeepSeek's
shapes, and decode graphs of a small MLA model replaying what eager computes.

Run on the GPU machine: `pytest -q -m gpu tests/test_mla_gpu.py`.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from replay_check import assert_replay_equals_eager
from test_triton_decode import assert_attention_close
from test_triton_mla import latent_pool, run_decode, run_extend

from cgtool.specs.config import load_model_config

pytestmark = pytest.mark.gpu
CUDA = "cuda"


@pytest.mark.parametrize("num_heads", [16, 128])  # deepseek-v2-lite's and DeepSeek-V3's
def test_mla_decode_bf16_matches_reference_up_to_32k(num_heads):
    seq_lens = [1, 2, 31, 32, 33, 1000, 4097, 32768, 513, 17]
    pool, rows = latent_pool(seq_lens, num_heads, 512, 64, torch.bfloat16, CUDA)
    out, ref = run_decode(pool, rows, seq_lens, num_heads)
    assert_attention_close(out, ref, atol=2e-2)


def test_mla_extend_bf16_matches_reference_for_long_prefixes():
    prefix_lens, new_lens = [0, 8192, 1000, 0, 300], [2048, 1, 700, 1, 129]
    capacities = [p + n for p, n in zip(prefix_lens, new_lens)]
    pool, rows = latent_pool(capacities, 16, 512, 64, torch.bfloat16, CUDA)
    out, ref = run_extend(pool, rows, prefix_lens, new_lens, 16, num_padding=61)
    assert out[sum(new_lens):].eq(0).all()
    assert_attention_close(out[: sum(new_lens)], ref[: sum(new_lens)], atol=2e-2)


@pytest.fixture(scope="module")
def mla_bench():
    from cgtool.capture.workbench import build_workbench

    # deepseek-v2-lite's attention (16 heads, latent 512 + 64) in two dense layers.
    cfg = dataclasses.replace(load_model_config("deepseek-v2-lite"), num_layers=2, moe=None)
    return build_workbench(
        cfg, weights_dir=None, dtype=torch.bfloat16, mem_fraction_static=0.5,
        max_bs=16, max_tokens=64, context_len=300, seed=0, kv_tokens=8192,
    )


def test_mla_decode_graphs_replay_equal_to_eager(mla_bench):
    from cgtool.runners.decode import DecodeGraphRunner

    assert mla_bench.runner.kv_pool.is_latent
    runner = DecodeGraphRunner(mla_bench.runner, [1, 2, 4, 8, 16])
    runner.capture()
    model = mla_bench.runner.model
    for bs in (1, 3, 8, 13, 16):
        batch = mla_bench.decode_batch(bs)
        eager = model.compute_logits(mla_bench.runner.forward_eager(batch))
        replayed = runner.replay(batch).clone()
        assert replayed.shape == (bs, model.cfg.vocab_size)
        assert_replay_equals_eager(replayed, eager)
