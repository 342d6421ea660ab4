"""The one-launch K/V store against index_copy_ (the reference): strided inputs, scattered
slots, a latent pool. Without a GPU the kernel runs in Triton's interpreter."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from cgtool.runtime import kv_store
from cgtool.runtime.kv_store import STORE_BLOCK, _store_reference, store_kv, store_kv_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(tokens: int, heads: int, dim: int, slots: int = 64, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    # k and v as the layer leaves them: views of one [tokens, q + k + v] projection output.
    qkv = torch.randn(tokens, (2 * heads + 2 * heads) * dim, generator=gen).to(DEVICE)
    k = qkv[:, 2 * heads * dim: 3 * heads * dim].view(tokens, heads, dim)
    v = qkv[:, 3 * heads * dim:].view(tokens, heads, dim)
    loc = torch.randperm(slots, generator=gen)[:tokens].to(DEVICE)
    caches = [torch.full((slots, heads, dim), float("nan"), device=DEVICE) for _ in range(4)]
    return k, v, loc, caches


@pytest.mark.parametrize("tokens,heads,dim", [(1, 2, 8), (5, 2, 8), (3, 4, 160)])
def test_the_kernel_writes_what_index_copy_writes(tokens, heads, dim):
    k, v, loc, (k_ref, v_ref, k_out, v_out) = _case(tokens, heads, dim)
    assert tokens == 1 or not v.is_contiguous()  # read where it lies, no copy first
    _store_reference(k_ref, v_ref, loc, k.contiguous(), v.contiguous())
    store_kv_triton(k_out, v_out, loc, k, v)
    # Untouched slots stay NaN in both; written ones are exact copies.
    torch.testing.assert_close(k_out, k_ref, equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(v_out, v_ref, equal_nan=True, rtol=0, atol=0)


def test_a_row_longer_than_one_block_is_written_whole():
    heads, dim = 3, STORE_BLOCK // 2  # 1.5 blocks a row
    k, v, loc, (k_ref, v_ref, k_out, v_out) = _case(2, heads, dim)
    _store_reference(k_ref, v_ref, loc, k.contiguous(), v.contiguous())
    store_kv_triton(k_out, v_out, loc, k, v)
    torch.testing.assert_close(k_out, k_ref, equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(v_out, v_ref, equal_nan=True, rtol=0, atol=0)


def test_a_latent_pool_stores_k_alone():
    k, _, loc, (k_ref, _, k_out, _) = _case(4, 1, 24)
    _store_reference(k_ref, None, loc, k.contiguous(), None)
    store_kv_triton(k_out, None, loc, k, None)
    torch.testing.assert_close(k_out, k_ref, equal_nan=True, rtol=0, atol=0)


def test_int32_slots_are_read_as_slots():
    k, v, loc, (k_ref, v_ref, k_out, v_out) = _case(3, 2, 8)
    store_kv(k_ref, v_ref, loc, k, v)
    store_kv_triton(k_out, v_out, loc.to(torch.int32), k, v)
    torch.testing.assert_close(k_out, k_ref, equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(v_out, v_ref, equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("dependent", [True, False])
def test_the_store_releases_the_attention_after_it_where_dependent_launches_run(monkeypatch, dependent):
    # MLA decode's stage 1 reads its lengths, slots and older rows while the store runs
    # (gluon_mla): the store lets it be scheduled at once.
    launches = []
    monkeypatch.setattr(kv_store, "dependent_launch",
                        lambda device: {"PDL": True, "launch_pdl": True} if dependent else {"PDL": False})
    monkeypatch.setattr(kv_store._STORE_KV, "launch", lambda grid, *args, **meta: launches.append(meta))
    cache = torch.zeros(8, 1, 576)
    store_kv_triton(cache, None, torch.tensor([3, 5]), torch.ones(2, 1, 576), None)
    assert launches[0]["RELEASE"] is dependent
    assert "launch_pdl" not in launches[0]  # the store itself waits for what came before
