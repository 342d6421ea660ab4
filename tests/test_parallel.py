"""What one tensor-parallel rank holds and what its collectives cost, checked by hand."""

from dataclasses import replace

import numpy as np
import pytest

from cgtool.errors import CgtoolError
from cgtool.planner.parallel import (
    allgather_ms,
    allreduce_ms,
    check_tp_size,
    comm_ms,
    kv_heads_per_rank,
    rank_shapes,
    valid_tp_sizes,
)
from cgtool.specs.config import load_model_config, preset_names
from cgtool.specs.gpus import GPU_SPECS, gpu_spec

CFG = load_model_config("llama-3.1-8b")
TINY = load_model_config("tiny")  # 4 attention heads, 2 KV heads
H100 = gpu_spec("H100-80GB")

# llama-3.1-8b by hand: hidden 4096, MLP 14336, 32 layers, 32 heads and 8 KV heads of 128,
# vocabulary 128256, embedding and LM head untied.
LLAMA_PARAMS = 8_030_261_248
LLAMA_NORM_PARAMS = 32 * 2 * 4096 + 4096  # two RMSNorms a layer and the final one, replicated


def test_one_rank_holds_the_whole_model():
    for name in preset_names():
        cfg = load_model_config(name)
        assert rank_shapes(cfg, 1).param_count() == cfg.param_count()
    assert CFG.param_count() == LLAMA_PARAMS


def test_tp2_halves_every_weight_but_the_norms():
    shard = rank_shapes(CFG, 2)
    split = (LLAMA_PARAMS - LLAMA_NORM_PARAMS) // 2
    assert shard.param_count() == split + LLAMA_NORM_PARAMS == 4_015_263_744
    assert shard.weight_bytes(2) == 2 * 4_015_263_744  # 7.48 GiB of 14.96
    # attention per layer: qkv 4096 x (2048 + 2 x 512), o_proj 2048 x 4096
    assert shard.q_size == 2048 and shard.kv_size == 512


def test_tp2_halves_kv_per_token():
    # 2 (K and V) x 32 layers x 4 KV heads x 128 x 2 bytes
    assert rank_shapes(CFG, 2).kv_bytes_per_token(2) == 65_536
    assert CFG.kv_bytes_per_token(2) == 131_072


def test_kv_heads_are_replicated_when_ranks_outnumber_them():
    assert kv_heads_per_rank(TINY, 4) == 1
    assert rank_shapes(TINY, 4).kv_bytes_per_token() == rank_shapes(TINY, 2).kv_bytes_per_token()
    # 8 KV heads over 16 ranks: one each, as at 8 ranks, while the weights keep shrinking
    assert rank_shapes(CFG, 16).kv_bytes_per_token() == rank_shapes(CFG, 8).kv_bytes_per_token()
    assert rank_shapes(CFG, 16).weight_bytes() < rank_shapes(CFG, 8).weight_bytes()


def test_valid_sizes_follow_the_heads_and_mlp_width():
    assert valid_tp_sizes(CFG) == [1, 2, 4, 8]
    assert valid_tp_sizes(load_model_config("qwen2.5-7b")) == [1, 2, 4]  # 28 heads, 4 KV heads
    assert valid_tp_sizes(TINY) == [1, 2, 4]


@pytest.mark.parametrize(
    "tp, words",
    [(0, "not a number of GPUs"), (-2, "not a number"), (3, "32 attention heads"), (16, "8-GPU")],
)
def test_bad_tp_sizes_are_refused_with_the_sizes_that_work(tp, words):
    with pytest.raises(CgtoolError, match=words) as exc:
        check_tp_size(CFG, tp, H100)
    assert exc.value.message.startswith(f"--tp {tp}")
    assert exc.value.remedy == "Use --tp 1, 2, 4 or 8 for llama-3.1-8b."


def test_a_gpu_without_link_figures_cannot_plan_tp():
    bare = replace(H100, link_bytes_s=0.0)
    check_tp_size(CFG, 1, bare)
    with pytest.raises(CgtoolError, match="link"):
        check_tp_size(CFG, 2, bare)


def test_every_gpu_in_the_table_has_link_figures():
    assert all(g.link_bytes_s > 0 and g.link_latency_s > 0 for g in GPU_SPECS.values())
    assert gpu_spec("H100-PCIe").link_bytes_s < H100.link_bytes_s


def test_ring_all_reduce_by_hand():
    one_mib = np.array([float(1 << 20)])
    # 2 ranks: each sends and receives half the buffer twice, over 80% of 450 GB/s, + 8 us
    expected_ms = (2 * 0.5 * (1 << 20) / (450e9 * 0.8) + 8e-6) * 1e3
    assert allreduce_ms(H100, one_mib, 2)[0] == pytest.approx(expected_ms)
    assert allreduce_ms(H100, one_mib, 8)[0] > allreduce_ms(H100, one_mib, 2)[0]
    assert allreduce_ms(H100, one_mib, 1)[0] == 0.0


def test_collectives_grow_with_tokens_and_vanish_on_one_gpu():
    tokens = np.array([1.0, 64.0, 4096.0])
    ms = comm_ms(CFG, H100, 2, tokens, tokens)
    assert np.all(np.diff(ms) > 0)
    # One row: 65 all-reduces (2 a layer + the embedding's) of 4096 bf16, and the logits'
    # all-gather of 128256 bf16.
    by_hand = 65 * allreduce_ms(H100, np.array([8192.0]), 2) + allgather_ms(
        H100, np.array([256_512.0]), 2
    )
    assert ms[0] == pytest.approx(by_hand[0])
    assert np.all(comm_ms(CFG, H100, 1, tokens, tokens) == 0)
