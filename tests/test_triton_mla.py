"""Triton MLA decode and extend kernels over a latent pool, against the torch reference.

Runs in Triton's interpreter without a GPU (conftest sets TRITON_INTERPRET) on fp32/fp16
pools; bf16 and capture are in test_mla_gpu.py.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
# CPU tensors through Triton's interpreter, which conftest turns on only without a GPU.
pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="interpreter tests; on a GPU, test_mla_gpu.py runs the kernels"
)

from test_triton_decode import assert_attention_close

from cgtool.attention.torch_ref import TorchAttentionBackend
from cgtool.attention.triton_backend import TritonAttentionBackend
from cgtool.runtime.engine import decode_batch, extend_batch
from cgtool.runtime.kv import KVPool
from cgtool.specs.config import ModelConfig
from cgtool.specs.config_parts import MlaConfig


def latent_config(num_heads: int, rank: int, rope: int, context: int) -> ModelConfig:
    """A one-layer MLA config whose kernels see `num_heads` query heads over one latent head."""
    return ModelConfig(
        name="mla-kernel-test", architecture="DeepseekV2ForCausalLM", vocab_size=16,
        hidden_size=64, intermediate_size=16, num_layers=1, num_heads=num_heads, num_kv_heads=1,
        head_dim=rank + rope, max_context_len=context,
        mla=MlaConfig(kv_lora_rank=rank, qk_nope_head_dim=16, qk_rope_head_dim=rope, v_head_dim=16),
    )


def latent_pool(
    capacities: list[int], num_heads: int, rank: int, rope: int, dtype: torch.dtype, device: str,
) -> tuple[KVPool, list[int]]:
    """One-layer latent pool whose requests own `capacities` slots scattered at random; every
    other slot (slot 0 too) holds NaN, so reading a row past seq_lens shows."""
    gen = torch.Generator(device=device).manual_seed(0)
    cfg = latent_config(num_heads, rank, rope, max(capacities))
    num_slots = sum(capacities) + 64
    pool = KVPool(cfg, num_slots, len(capacities) + 2, max(capacities), dtype, device)
    owned = torch.randperm(num_slots - 1, generator=gen, device=device)[: sum(capacities)] + 1
    buf = pool.k_buffers[0]
    buf.fill_(float("nan"))
    buf[owned] = torch.randn(buf[owned].shape, generator=gen, device=device).to(dtype)
    rows = list(range(len(capacities), 0, -1))  # reversed, so req_pool_indices is no identity
    for row, slots in zip(rows, owned.split(capacities)):
        pool.req_to_token[row, : len(slots)] = slots.int()
    return pool, rows


def latent_q(num_tokens: int, num_heads: int, width: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    gen = torch.Generator(device=device).manual_seed(1)
    # Twice unit scale peaks the softmax, so a dropped or doubled chunk shows in an atol check.
    return (torch.randn((num_tokens, num_heads * width), generator=gen, device=device) * 2).to(dtype)


def run_both(
    pool: KVPool, batch, num_tokens: int, num_heads: int, num_kv_splits: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(triton output, reference output): [num_tokens, heads * rank] each."""
    width = pool.k_buffers[0].shape[-1]
    device = str(pool.req_to_token.device)
    q = latent_q(num_tokens, num_heads, width, pool.k_buffers[0].dtype, device)
    out = q.new_full((num_tokens, num_heads * pool.value_dim), float("nan"))
    ref = torch.full_like(out, float("nan"))
    TritonAttentionBackend(num_heads, width, num_kv_splits).forward(q, out, 0, batch, pool)
    TorchAttentionBackend(num_heads, width).forward(q, ref, 0, batch, pool)
    return out, ref


def run_decode(pool, rows, seq_lens, num_heads, num_kv_splits=None):
    batch = decode_batch(pool, rows, [n - 1 for n in seq_lens], [0] * len(rows))
    return run_both(pool, batch, len(rows), num_heads, num_kv_splits)


def run_extend(pool, rows, prefix_lens, new_lens, num_heads, num_padding=0):
    batch = extend_batch(pool, rows, prefix_lens, [[0] * n for n in new_lens])
    return run_both(pool, batch, sum(new_lens) + num_padding, num_heads)


@pytest.mark.parametrize("seq_lens", [[1], [1, 200, 33, 7], [64, 65, 500]])
def test_decode_over_deepseek_latent_of_576_matches_reference(seq_lens):
    pool, rows = latent_pool(seq_lens, 16, 512, 64, torch.float32, "cpu")
    out, ref = run_decode(pool, rows, seq_lens, 16)
    assert out.shape == (len(seq_lens), 16 * 512)
    assert_attention_close(out, ref, atol=1e-4)


@pytest.mark.parametrize(("num_heads", "rank", "rope"), [(20, 48, 16), (3, 96, 8), (16, 40, 24)])
def test_decode_with_odd_widths_and_head_counts_matches_reference(num_heads, rank, rope):
    # 20 heads leave a partial block of 16; rank 48 and 40 and rope 24 are no powers of two.
    seq_lens = [5, 130, 31]
    pool, rows = latent_pool(seq_lens, num_heads, rank, rope, torch.float32, "cpu")
    out, ref = run_decode(pool, rows, seq_lens, num_heads)
    assert_attention_close(out, ref, atol=1e-4)


def test_decode_with_several_key_blocks_per_chunk_matches_reference():
    # 16 chunks of 1100 keys are 96 each: three blocks of 32 per chunk, the merge over all.
    seq_lens = [1100, 40, 1]
    pool, rows = latent_pool(seq_lens, 16, 64, 16, torch.float32, "cpu")
    out, ref = run_decode(pool, rows, seq_lens, 16, num_kv_splits=16)
    assert_attention_close(out, ref, atol=1e-4)


def test_decode_reads_only_rows_before_seq_len():
    pool, rows = latent_pool([256, 256], 16, 64, 16, torch.float32, "cpu")
    out, ref = run_decode(pool, rows, [40, 129], 16)
    assert_attention_close(out, ref, atol=1e-4)


def test_decode_matches_reference_in_fp16():
    seq_lens = [100, 300, 5]
    pool, rows = latent_pool(seq_lens, 16, 512, 64, torch.float16, "cpu")
    out, ref = run_decode(pool, rows, seq_lens, 16)
    assert_attention_close(out, ref, atol=5e-3)


@pytest.mark.parametrize(("rank", "rope"), [(512, 64), (48, 16)])
def test_extend_over_the_latent_matches_reference_for_mixed_prefixes(rank, rope):
    # 40 new tokens span two query blocks of 32; prefixes 3 and 70 are not block-aligned.
    prefix_lens, new_lens = [0, 70, 3], [40, 1, 20]
    capacities = [p + n for p, n in zip(prefix_lens, new_lens)]
    pool, rows = latent_pool(capacities, 4, rank, rope, torch.float32, "cpu")
    out, ref = run_extend(pool, rows, prefix_lens, new_lens, 4)
    assert_attention_close(out, ref, atol=1e-4)


def test_extend_padding_rows_are_zero_and_harmless():
    pool, rows = latent_pool([14, 3], 4, 48, 16, torch.float32, "cpu")
    out, ref = run_extend(pool, rows, [5, 0], [9, 3], 4, num_padding=5)
    assert out[12:].eq(0).all()
    assert_attention_close(out[:12], ref[:12], atol=1e-4)


def tiny_mla_config(context: int = 64) -> ModelConfig:
    """deepseek-v2-lite's attention in miniature: dense MLP, two layers, rank 32, rope 16."""
    import dataclasses

    from cgtool.specs.config import load_model_config

    mla = MlaConfig(kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16)
    return dataclasses.replace(
        load_model_config("deepseek-v2-lite"), name="tiny-mla", vocab_size=128, hidden_size=64,
        intermediate_size=96, num_layers=2, num_heads=4, head_dim=48, max_context_len=context,
        moe=None, mla=mla,
    )


def mla_runner(backend: str, dtype: torch.dtype, device: str, context: int = 64):
    from cgtool.attention import make_backend
    from cgtool.model.loader import build_model
    from cgtool.runtime.engine import ModelRunner

    cfg = tiny_mla_config(context)
    torch.manual_seed(0)
    model = build_model(cfg, device=device, dtype=dtype, max_positions=context)
    pool = KVPool(cfg, num_slots=8 * context, max_reqs=8, max_context_len=context, dtype=dtype,
                  device=device)
    return ModelRunner(model, pool, make_backend(backend, cfg.num_heads, cfg.head_dim))


def test_tiny_mla_model_gives_the_same_logits_with_triton_kernels_as_with_the_reference():
    runners = {name: mla_runner(name, torch.float32, "cpu") for name in ("torch", "triton")}
    logits = {}
    for name, runner in runners.items():
        pool = runner.kv_pool
        rows = [pool.alloc_request(n)[0] for n in (9, 3)]
        prefill = extend_batch(pool, rows, [0, 0], [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10]])
        step = decode_batch(pool, rows, [8, 2], [11, 12])
        logits[name] = [runner.model.compute_logits(runner.forward_eager(b)) for b in (prefill, step)]
    for got, expected in zip(logits["triton"], logits["torch"]):
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def _decode_direct(seq_lens, num_kv_splits, fused_merge, num_heads=20, rank=48, rope=16, min_chunk=16,
                   scratch=None, warps=4, merge_lanes=None):
    """mla_decode_attention called directly on one latent pool, with the chunking given (16-key
    blocks; by default no minimum chunk beyond one block)."""
    from cgtool.attention.triton_mla import mla_decode_attention

    pool, rows = latent_pool(seq_lens, num_heads, rank, rope, torch.float32, "cpu")
    q = latent_q(len(seq_lens), num_heads, rank + rope, torch.float32, "cpu").view(len(seq_lens), num_heads, -1)
    out = torch.full((len(seq_lens), num_heads, rank), float("nan"))
    mla_decode_attention(
        q, pool.k_buffers[0], out, pool.req_to_token, torch.tensor(rows, dtype=torch.int32),
        torch.tensor(seq_lens, dtype=torch.int32), 0.1, num_kv_splits, scratch=scratch, tiles=(16, warps, 2),
        fused_merge=fused_merge, min_chunk=min_chunk, merge_lanes=merge_lanes,
    )
    return out


def _chunks_written(seq_lens, num_kv_splits, min_chunk, fused_merge=True) -> list[int]:
    """How many of each request's chunks stage 1 wrote a partial for (the rest returned at
    once), read from the partials' log-sum-exps, NaN before the call."""
    from cgtool.attention.triton_decode import decode_scratch

    scratch: dict = {}
    _, mid_lse = decode_scratch(len(seq_lens), 20, 48, num_kv_splits, torch.device("cpu"), scratch)
    mid_lse.fill_(float("nan"))
    _decode_direct(seq_lens, num_kv_splits, fused_merge, min_chunk=min_chunk, scratch=scratch)
    return (~mid_lse[:, 0].isnan()).sum(1).tolist()


def test_fused_merge_fills_fewer_chunks_of_at_least_the_minimum():
    # 8 chunks of at least 64 keys, or of the length that fills 4: 600 keys take 8 of 80, 300
    # take 5 of 64, 64 take 4 of 16, 65 take 3 of 32.
    seq_lens = [600, 300, 64, 65, 1]
    assert _chunks_written(seq_lens, 8, 64) == [8, 5, 4, 3, 1]
    assert _chunks_written(seq_lens, 8, 16) == [8, 7, 4, 5, 1]  # 300 keys: 7 chunks of 48
    reference = _decode_direct(seq_lens, 8, fused_merge=False)
    torch.testing.assert_close(_decode_direct(seq_lens, 8, True, min_chunk=64), reference, rtol=1e-6, atol=1e-6)


def test_fused_merge_gives_a_request_of_no_keys_zeros_and_puts_its_tickets_back():
    # Only chunks holding keys take a ticket, and chunk 0 always does: a row of no keys (as a
    # padded graph row may be) is merged from nothing, to zeros, by chunk 0 alone.
    from cgtool.runtime.tickets import tickets

    out = _decode_direct([0, 70, 0], 4, True)
    assert out[0].eq(0).all() and out[2].eq(0).all()
    torch.testing.assert_close(out[1:2], _decode_direct([0, 70, 0], 4, False)[1:2], rtol=1e-6, atol=1e-6)
    assert tickets("cpu", 8).eq(0).all()


def test_the_default_minimum_chunk_applies_to_the_fused_merge_only(monkeypatch):
    from cgtool.attention import triton_mla

    monkeypatch.setattr(triton_mla, "FUSED_MIN_CHUNK", 256)
    assert _chunks_written([1024, 700, 200, 2048], 8, None) == [4, 4, 4, 8]  # 256, 176, 64, 256 keys
    with pytest.raises(AssertionError, match="whole key blocks"):
        _decode_direct([100], 4, True, min_chunk=40)


def test_the_merge_kernel_merges_the_chunks_a_minimum_leaves():
    # The merge kernel counts a request's chunks as stage 1 cut them. In 11 chunks of 16-key
    # blocks, 300 keys take 10 of 32 with no minimum and 5 of 64 with one of 64; 600 keys take
    # 10 of 64 either way, 64 keys 4 of 16 (the length that fills half the chunks is shorter
    # than the minimum). Merged, the same attention.
    seq_lens = [600, 300, 64, 1]
    assert _chunks_written(seq_lens, 11, 64, fused_merge=False) == [10, 5, 4, 1]
    assert _chunks_written(seq_lens, 11, 16, fused_merge=False) == [10, 10, 4, 1]
    torch.testing.assert_close(_decode_direct(seq_lens, 11, False, min_chunk=64),
                               _decode_direct(seq_lens, 11, False), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("num_kv_splits", [9, 13])
def test_the_merge_kernel_over_the_chunk_counts_lanes_matches_64_lanes_and_the_last_program(num_kv_splits):
    # From 9 chunks the merge kernel sums over the count's power of two (16 lanes), not 64.
    seq_lens = [600, 130, 7]
    fewer = _decode_direct(seq_lens, num_kv_splits, False)
    assert not fewer.isnan().any()
    torch.testing.assert_close(fewer, _decode_direct(seq_lens, num_kv_splits, False, merge_lanes=64),
                               rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(fewer, _decode_direct(seq_lens, num_kv_splits, True), rtol=1e-6, atol=1e-6)


def test_partials_are_bf16_only_at_eight_warps_merged_in_the_last_program():
    seq_lens = [300, 45]
    chosen = {}
    for fused, warps in ((True, 8), (True, 4), (False, 8)):
        scratch: dict = {}
        out = _decode_direct(seq_lens, 7, fused, scratch=scratch, warps=warps)
        chosen[fused, warps] = {key[-1] for key in scratch if key[0] == "decode_scratch"}
        # bf16 partials round each chunk's output once more: within bf16's step of fp32's.
        torch.testing.assert_close(out, _decode_direct(seq_lens, 7, False), rtol=1e-2, atol=1e-2)
    assert chosen == {(True, 8): {torch.bfloat16}, (True, 4): {torch.float32}, (False, 8): {torch.float32}}


def test_default_tiles_take_eight_warps_and_bf16_partials_from_four_chunks_merged_in_the_last_program():
    from cgtool.attention import triton_mla

    assert triton_mla.FOUR_WARPS_SPLITS == 3 and triton_mla.DECODE_TILES_FEW_CHUNKS[1] == 4
    assert triton_mla.DECODE_TILES[1] == 8
    for splits, dtype in ((3, torch.float32), (4, torch.bfloat16), (8, torch.bfloat16), (9, torch.float32)):
        scratch: dict = {}
        pool, rows = latent_pool([130, 20], 16, 48, 16, torch.float32, "cpu")
        q = latent_q(2, 16, 64, torch.float32, "cpu").view(2, 16, -1)
        out = torch.empty(2, 16, 48)
        triton_mla.mla_decode_attention(q, pool.k_buffers[0], out, pool.req_to_token, torch.tensor(rows, dtype=torch.int32),
                                        torch.tensor([130, 20], dtype=torch.int32), 0.1, splits, scratch=scratch)
        assert {key[-1] for key in scratch if key[0] == "decode_scratch"} == {dtype}, splits


@pytest.mark.parametrize("num_kv_splits", [1, 2, 3, 4, 5, 8])
def test_merge_in_the_last_program_matches_the_merge_kernel(num_kv_splits):
    # 20 heads: a full block and a partial one, each with its own ticket; lengths 1 and 3 leave
    # most chunks empty, 150 fills them all. One chunk is written as the output directly.
    from cgtool.runtime.tickets import tickets

    seq_lens = [150, 1, 37, 3]
    merged = _decode_direct(seq_lens, num_kv_splits, fused_merge=False)
    fused = _decode_direct(seq_lens, num_kv_splits, fused_merge=True)
    assert not fused.isnan().any()
    torch.testing.assert_close(fused, merged, rtol=1e-6, atol=1e-6)
    assert tickets("cpu", 8).eq(0).all(), "the last program puts its counter back to zero"


def test_mla_splits_follow_the_batch_size_down_to_one_chunk():
    from cgtool.attention.triton_mla import mla_num_kv_splits

    assert [mla_num_kv_splits(bs, 16) for bs in (1, 8, 64, 128, 256, 512)] == [64, 32, 4, 2, 1, 1]
    # Rounded down to stay within 264 programs (two an SM on 132 SMs): one wave, not two; below
    # 16 chunks any count, from there a power of two.
    assert [mla_num_kv_splits(bs, 16) for bs in (5, 9, 17, 20, 24, 29, 30, 33, 48, 65, 88, 129)] == [
        32, 16, 15, 13, 11, 9, 8, 8, 5, 4, 3, 2]
    assert [mla_num_kv_splits(bs, 128) for bs in (1, 3, 17)] == [32, 11, 1]
    assert all(mla_num_kv_splits(bs, 16) * bs <= 264 for bs in range(1, 265))


@pytest.mark.parametrize("kv_splits", [2, 5])
@pytest.mark.parametrize("new_lens", [[70, 1, 9], [20, 1, 9]])  # 64-row query blocks; 32-row ones
def test_extend_with_split_keys_matches_reference(kv_splits, new_lens, monkeypatch):
    # Through the backend, as a step of few programs over long prefixes runs on the GPU: the
    # keys split (forced here: the CPU has no SMs to fill), some chunks empty (prefix 0).
    from cgtool.attention import triton_extend

    monkeypatch.setattr(triton_extend, "extend_kv_splits", lambda *args: kv_splits)
    prefix_lens = [0, 700, 130]
    capacities = [p + n for p, n in zip(prefix_lens, new_lens)]
    pool, rows = latent_pool(capacities, 16, 40, 24, torch.float32, "cpu")
    out, ref = run_extend(pool, rows, prefix_lens, new_lens, 16, num_padding=3)
    assert out[sum(new_lens):].eq(0).all() and not out.isnan().any()
    assert_attention_close(out[: sum(new_lens)], ref[: sum(new_lens)], atol=1e-4)


@pytest.mark.parametrize("kv_splits", [1, 4])
@pytest.mark.parametrize(("heads", "new_lens"), [(16, [1, 3, 2]), (8, [5, 1, 9]), (1, [5, 1, 9])])
def test_extend_with_heads_as_rows_matches_reference(heads, new_lens, kv_splits):
    # Every head shares the latent row, so a program may take all 16 heads of a token (1 token
    # a 16-row block, 4 of 64), 8 of them, or one head's tokens as before.
    from cgtool.attention.triton_mla import mla_extend_attention

    prefix_lens = [0, 700, 130]
    capacities = [p + n for p, n in zip(prefix_lens, new_lens)]
    pool, rows = latent_pool(capacities, 16, 40, 24, torch.float32, "cpu")
    batch = extend_batch(pool, rows, prefix_lens, [[0] * n for n in new_lens])
    q = latent_q(sum(new_lens) + 2, 16, 64, torch.float32, "cpu")
    out = torch.zeros(q.shape[0], 16 * 40)
    ref = torch.full_like(out, float("nan"))
    mla_extend_attention(
        q.view(-1, 16, 64), pool.k_buffers[0], out.view(-1, 16, 40), pool.req_to_token, batch.req_pool_indices,
        batch.extend_prefix_lens, batch.extend_seq_lens, batch.extend_start_loc, 64**-0.5, max(new_lens),
        new_tokens=sum(new_lens), kv_splits=kv_splits, heads=heads,
    )
    TorchAttentionBackend(16, 64).forward(q, ref, 0, batch, pool)
    assert out[sum(new_lens):].eq(0).all() and not out.isnan().any()
    assert_attention_close(out[: sum(new_lens)], ref[: sum(new_lens)], atol=1e-4)
