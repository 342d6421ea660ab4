import pytest
import torch

from cgtool.runtime.kv import KVPool, kv_tokens_for_budget
from cgtool.specs.config import load_model_config


def _pool(name, slots=8):
    cfg = load_model_config(name)
    return cfg, KVPool(cfg, num_slots=slots, max_reqs=2, max_context_len=4, dtype=torch.bfloat16,
                       device="cpu")


def test_mla_pool_keeps_one_latent_buffer_per_layer():
    cfg, pool = _pool("deepseek-v2-lite")
    assert pool.v_buffers is pool.k_buffers
    assert pool.k_buffers[0].shape == (8, 1, 512 + 64)
    assert pool.nbytes == 8 * cfg.kv_bytes_per_token(2) == 8 * cfg.num_layers * 576 * 2


def test_dense_pool_keeps_k_and_v_apart():
    cfg, pool = _pool("tiny")
    assert pool.v_buffers is not pool.k_buffers
    assert pool.nbytes == 8 * cfg.kv_bytes_per_token(2)


def test_mla_store_writes_the_latent_once_where_attention_reads_k_and_v():
    _, pool = _pool("deepseek-v2-lite")
    latent = torch.randn(2, 1, 576).to(torch.bfloat16)
    pool.store(3, torch.tensor([5, 6]), latent, latent)
    assert torch.equal(pool.k_buffers[3][5:7], latent) and torch.equal(pool.v_buffers[3][5:7], latent)


def test_latent_pool_holds_more_tokens_for_the_same_budget():
    budget = 1 << 30
    tokens = kv_tokens_for_budget(load_model_config("deepseek-v2-lite"), budget, torch.bfloat16)
    assert tokens == budget // (27 * (512 + 64) * 2)


def test_free_memory_is_read_after_the_cached_blocks_are_handed_back(monkeypatch):
    # SGLang empties the allocator's cache before it reads free memory to size its pool.
    from cgtool.runtime import kv

    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: calls.append("synchronize"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: calls.append("mem_get_info") or (3, 8))
    assert kv.free_after_weights() == (3, 8)
    assert calls == ["synchronize", "empty_cache", "mem_get_info"]


@pytest.mark.gpu
def test_a_second_workbench_in_one_process_gets_the_first_ones_pool():
    # The first one's weights and pool, cached once it is dropped, read as free again.
    from cgtool.capture.workbench import build_workbench
    from cgtool.specs.config import load_model_config

    def build():
        return build_workbench(load_model_config("qwen2.5-0.5b"), weights_dir=None, dtype=torch.bfloat16,
                               mem_fraction_static=0.5, max_bs=4, max_tokens=64, context_len=256, seed=0)

    first = build()
    tokens = first.kv_tokens
    del first
    assert build().kv_tokens == tokens
