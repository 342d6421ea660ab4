"""Triton split-KV decode attention against the torch reference backend.

Without a GPU the kernels run in Triton's interpreter (conftest sets TRITON_INTERPRET) on
small fp32/fp16 pools; the interpreter's tl.dot mishandles bf16, so bf16 is tested on the GPU.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from cgtool.attention.torch_ref import TorchAttentionBackend
from cgtool.attention.triton_backend import TritonAttentionBackend
from cgtool.attention.triton_decode import chunk_slots, num_kv_splits_for, target_chunks
from cgtool.runtime.engine import decode_batch
from cgtool.runtime.kv import KVPool
from cgtool.specs.config import ModelConfig

CUDA = "cuda"
# CPU tensors run only in Triton's interpreter: on a GPU machine the same cases run as GPU tests.
INTERPRETER_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors in Triton's interpreter")


def random_pool(
    capacities: list[int], num_heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
    device: str, seed: int = 0,
) -> tuple[KVPool, list[int]]:
    """One-layer pool whose requests own `capacities` slots scattered at random.

    Every slot no request owns, slot 0 included (where the unused tail of each
    req_to_token row points), holds NaN: a kernel that reads a key past seq_lens
    returns NaN.
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    cfg = ModelConfig(
        name="kernel-test", architecture="LlamaForCausalLM", vocab_size=16,
        hidden_size=num_heads * head_dim, intermediate_size=16, num_layers=1,
        num_heads=num_heads, num_kv_heads=kv_heads, head_dim=head_dim,
        max_context_len=max(capacities),
    )
    num_slots = sum(capacities) + 64
    pool = KVPool(cfg, num_slots, len(capacities) + 2, max(capacities), dtype, device)
    owned = torch.randperm(num_slots - 1, generator=gen, device=device)[: sum(capacities)] + 1
    for buf in (pool.k_buffers[0], pool.v_buffers[0]):
        buf.fill_(float("nan"))
        buf[owned] = torch.randn(buf[owned].shape, generator=gen, device=device).to(dtype)
    # Rows in reverse so req_pool_indices is not the identity.
    rows = list(range(len(capacities), 0, -1))
    for row, slots in zip(rows, owned.split(capacities)):
        pool.req_to_token[row, : len(slots)] = slots.int()
    return pool, rows


def random_q(num_tokens: int, num_heads: int, head_dim: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    # Twice the unit scale makes the softmax peaked, so outputs stay O(1) even over 32k keys
    # and an absolute tolerance still catches a dropped or doubled chunk.
    gen = torch.Generator(device=device).manual_seed(1)
    q = torch.randn((num_tokens, num_heads * head_dim), generator=gen, device=device) * 2
    return q.to(dtype)  # [num_tokens, heads * head_dim], as the attention op passes it


def assert_attention_close(out: torch.Tensor, ref: torch.Tensor, atol: float) -> None:
    out, ref = out.float(), ref.float()
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, atol=atol, rtol=atol)
    assert (out - ref).norm() <= atol * ref.norm()


def run_decode(
    pool: KVPool, rows: list[int], seq_lens: list[int], num_heads: int, head_dim: int,
    chunks: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(triton output, reference output) for one decode step."""
    device = str(pool.req_to_token.device)
    batch = decode_batch(pool, rows, [n - 1 for n in seq_lens], [0] * len(rows))
    q = random_q(len(rows), num_heads, head_dim, pool.k_buffers[0].dtype, device)
    out, ref = torch.full_like(q, float("nan")), torch.full_like(q, float("nan"))
    TritonAttentionBackend(num_heads, head_dim, chunks=chunks).forward(q, out, 0, batch, pool)
    TorchAttentionBackend(num_heads, head_dim).forward(q, ref, 0, batch, pool)
    return out, ref


def test_kv_splits_are_powers_of_two_that_shrink_as_the_batch_grows():
    splits = [num_kv_splits_for(bs, kv_heads=8) for bs in (1, 2, 4, 8, 64, 256)]
    assert splits == [64, 64, 32, 16, 16, 16]


@INTERPRETER_ONLY
@pytest.mark.parametrize(("num_heads", "kv_heads", "head_dim"), [(4, 4, 64), (8, 2, 64), (8, 2, 128)])
def test_decode_matches_reference_for_mixed_seq_lens(num_heads, kv_heads, head_dim):
    seq_lens = [1, 200, 33, 7]  # 200 spans several chunks; 1 and 7 one partial block
    pool, rows = random_pool([256] * 4, num_heads, kv_heads, head_dim, torch.float32, "cpu")
    out, ref = run_decode(pool, rows, seq_lens, num_heads, head_dim)
    assert_attention_close(out, ref, atol=1e-4)


@INTERPRETER_ONLY
def test_decode_with_several_key_blocks_per_chunk_matches_reference():
    # 740 keys over 12 chunks are 64 keys a chunk: two BLOCK_N iterations each, the last partial.
    pool, rows = random_pool([700, 40, 1], 8, 2, 64, torch.float32, "cpu")
    out, ref = run_decode(pool, rows, [700, 40, 1], 8, 64, chunks=12)
    assert_attention_close(out, ref, atol=1e-4)


@INTERPRETER_ONLY
def test_a_long_request_beside_short_ones_takes_up_to_64_chunks_and_matches_reference():
    # 3,000 keys beside three short rows at 8 chunks: one length for all (3,000 / 64 rounded up
    # to 64 keys) gives the long row 47 chunks, the merge's lanes nearly full.
    lens = [3000, 5, 70, 33]
    pool, rows = random_pool(lens, 4, 2, 64, torch.float32, "cpu")
    out, ref = run_decode(pool, rows, lens, 4, 64, chunks=8)
    assert_attention_close(out, ref, atol=1e-4)


@INTERPRETER_ONLY
def test_filler_rows_of_a_padded_batch_change_no_bit_of_the_real_rows():
    """A decode graph pads its batch with rows of one token; the real rows must chunk as they
    do at their own size, so a padded replay equals the eager step bit for bit."""
    # 8 KV heads: at 5 requests and at 8 a split count fixed by the batch size differed.
    lens = [300, 17, 1000, 64, 5]
    pool, rows = random_pool(lens + [1, 1, 1], 16, 8, 64, torch.float32, "cpu")
    own = decode_batch(pool, rows[:5], [n - 1 for n in lens], [0] * 5)
    padded = decode_batch(pool, rows, [n - 1 for n in lens] + [0, 0, 0], [0] * 8)
    q = random_q(8, 16, 64, torch.float32, "cpu")
    outs = []
    for batch, bs in ((own, 5), (padded, 8)):
        out = torch.full_like(q[:bs], float("nan"))
        TritonAttentionBackend(16, 64).forward(q[:bs].contiguous(), out, 0, batch, pool)
        outs.append(out)
    torch.testing.assert_close(outs[1][:5], outs[0], atol=0, rtol=0)


def test_the_partials_always_have_room_and_never_less_than_the_fixed_splits_kept():
    for kv_heads in (1, 2, 8, 32):
        chunks = target_chunks(kv_heads)
        for bs in (1, 3, 8, 64, 256, 1024):
            slots = chunk_slots(bs, kv_heads, chunks)
            assert slots >= chunks + bs
            assert slots >= bs * num_kv_splits_for(bs, kv_heads)


@INTERPRETER_ONLY
def test_decode_matches_reference_in_fp16():
    pool, rows = random_pool([100, 300, 5], 8, 2, 64, torch.float16, "cpu")
    out, ref = run_decode(pool, rows, [100, 300, 5], 8, 64)
    assert_attention_close(out, ref, atol=5e-3)


@INTERPRETER_ONLY
def test_decode_reads_only_keys_before_seq_len():
    # Each row owns 256 real slots but attends only to its first seq_lens[b]: a kernel that
    # ignores seq_lens reads different keys and no longer matches.
    pool, rows = random_pool([256, 256], 4, 2, 64, torch.float32, "cpu")
    out, ref = run_decode(pool, rows, [40, 129], 4, 64)
    assert_attention_close(out, ref, atol=1e-4)


def test_a_request_with_no_keys_reads_zero():
    # fp32 in the interpreter; bf16 on the GPU, whose fp32 dots run in tf32.
    device, dtype, atol = (CUDA, torch.bfloat16, 2e-2) if torch.cuda.is_available() else ("cpu", torch.float32, 1e-4)
    pool, rows = random_pool([64, 64], 4, 2, 64, dtype, device)
    batch = decode_batch(pool, rows, [30, 9], [0, 0])
    batch.seq_lens[1] = 0  # a padded row that no chunk arrives for
    q = random_q(2, 4, 64, dtype, device)
    out, ref = torch.full_like(q, float("nan")), torch.full_like(q, float("nan"))
    TritonAttentionBackend(4, 64).forward(q, out, 0, batch, pool)
    TorchAttentionBackend(4, 64).forward(q[:1], ref[:1], 0, decode_batch(pool, rows[:1], [30], [0]), pool)
    assert_attention_close(out[:1], ref[:1], atol=atol)
    assert (out[1] == 0).all()


# ---------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_decode_bf16_matches_reference_up_to_32k(group, head_dim):
    num_heads = 32
    seq_lens = [1, 2, 31, 32, 33, 1000, 4097, 32768, 513, 17]
    pool, rows = random_pool(seq_lens, num_heads, num_heads // group, head_dim, torch.bfloat16, CUDA)
    out, ref = run_decode(pool, rows, seq_lens, num_heads, head_dim)
    assert_attention_close(out, ref, atol=2e-2)


@pytest.mark.gpu
def test_a_batch_of_more_than_4096_requests_launches_and_matches_reference():
    # 16 chunks a request: over 65,535 chunk programs, past the limit of a grid's second axis.
    lens = [3 + (i % 29) for i in range(4100)]
    pool, rows = random_pool(lens, 8, 2, 64, torch.bfloat16, CUDA)
    out, ref = run_decode(pool, rows, lens, 8, 64)
    assert_attention_close(out, ref, atol=2e-2)


@pytest.mark.gpu
def test_decode_replayed_graph_equals_eager_for_new_seq_lens():
    num_heads, kv_heads, head_dim, bs = 32, 8, 128, 4
    pool, rows = random_pool([20000] * bs, num_heads, kv_heads, head_dim, torch.bfloat16, CUDA)
    backend = TritonAttentionBackend(num_heads, head_dim)
    batch = decode_batch(pool, rows, [9, 99, 999, 49], [0] * bs)
    q = random_q(bs, num_heads, head_dim, torch.bfloat16, CUDA)
    out = torch.empty_like(q)
    backend.forward(q, out, 0, batch, pool)  # compiles the kernels outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        backend.forward(q, out, 0, batch, pool)

    new_lens = [3000, 1, 20000, 77]
    fresh = decode_batch(pool, rows[::-1], [n - 1 for n in new_lens], [0] * bs)
    batch.req_pool_indices.copy_(fresh.req_pool_indices)
    batch.seq_lens.copy_(fresh.seq_lens)
    q.copy_(torch.randn_like(q))
    graph.replay()
    eager = torch.empty_like(q)
    backend.forward(q, eager, 0, fresh, pool)
    torch.testing.assert_close(out, eager, atol=0, rtol=0)
    ref = torch.empty_like(q)
    TorchAttentionBackend(num_heads, head_dim).forward(q, ref, 0, fresh, pool)
    assert_attention_close(out, ref, atol=2e-2)


@pytest.mark.gpu
def test_a_padded_batch_reads_the_same_bits_as_at_its_own_size_in_bf16():
    """A batch padded up to a captured size (filler rows of one token) must chunk its real
    rows as at its own size: a padded replay of qwen2.5-0.5b once differed from eager by an ulp."""
    num_heads, kv_heads, head_dim = 14, 2, 64  # qwen2.5-0.5b
    lens = [301, 17, 1000, 64, 5, 999, 2, 512, 33, 300, 200, 100, 250]
    bs, padded_bs = len(lens), 16
    pool, rows = random_pool(lens + [1] * (padded_bs - bs), num_heads, kv_heads, head_dim, torch.bfloat16, CUDA)
    own = decode_batch(pool, rows[:bs], [n - 1 for n in lens], [0] * bs)
    padded = decode_batch(pool, rows, [n - 1 for n in lens] + [0] * (padded_bs - bs), [0] * padded_bs)
    gen = torch.Generator(device=CUDA).manual_seed(2)
    backend = TritonAttentionBackend(num_heads, head_dim)
    for _ in range(20):
        q = (torch.randn((padded_bs, num_heads * head_dim), generator=gen, device=CUDA) * 3).to(torch.bfloat16)
        a, b = torch.empty_like(q[:bs]), torch.empty_like(q)
        backend.forward(q[:bs].contiguous(), a, 0, own, pool)
        backend.forward(q, b, 0, padded, pool)
        torch.testing.assert_close(b[:bs], a, atol=0, rtol=0)


@INTERPRETER_ONLY
def test_layers_of_one_forward_share_one_scratch_block_and_stay_exact():
    """Within a forward the split buffers are allocated once and the chunks planned once,
    and every layer reuses them; each call still matches the reference, and nothing outlives
    the forward."""
    from cgtool.runtime.batch import forward_context, forward_memo, forward_scratch

    seq_lens = [200, 33]
    pool, rows = random_pool([256] * 2, 8, 2, 64, torch.float32, "cpu")
    batch = decode_batch(pool, rows, [n - 1 for n in seq_lens], [0] * len(rows))
    triton_backend, ref_backend = TritonAttentionBackend(8, 64), TorchAttentionBackend(8, 64)
    with forward_context(batch, pool, triton_backend, share_scratch=True):
        for scale in (1.0, -3.0):  # two "layers" with different queries
            q = random_q(len(rows), 8, 64, torch.float32, "cpu") * scale
            out, ref = torch.full_like(q, float("nan")), torch.full_like(q, float("nan"))
            triton_backend.forward(q, out, 0, batch, pool)
            ref_backend.forward(q, ref, 0, batch, pool)
            assert_attention_close(out, ref, atol=1e-4)
        assert len(forward_scratch()) == 1
        assert len(forward_memo()) == 1  # one chunk plan, worked out by the first layer
    assert forward_scratch() == {}
    assert forward_memo() == {}


@INTERPRETER_ONLY
def test_a_capture_allocates_split_buffers_per_layer_not_for_the_forward(monkeypatch):
    """Held across a captured forward, the shared block grew the graph pool; captures keep
    the per-layer allocation, which the pool reuses at once."""
    from cgtool.runtime.batch import forward_context, forward_scratch

    pool, rows = random_pool([64], 4, 4, 64, torch.float32, "cpu")
    batch = decode_batch(pool, rows, [31], [0])
    backend = TritonAttentionBackend(4, 64)
    q = random_q(1, 4, 64, torch.float32, "cpu")
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with forward_context(batch, pool, backend, share_scratch=True):
        backend.forward(q, torch.empty_like(q), 0, batch, pool)
        assert forward_scratch() == {}


@INTERPRETER_ONLY
def test_only_a_forward_that_asks_shares_split_buffers():
    """torch.compile's CUDA graph trees refuse a block that outlives the compiled call, so
    contexts other than the plain eager forward's keep nothing."""
    from cgtool.runtime.batch import forward_context, forward_scratch

    pool, rows = random_pool([64], 4, 4, 64, torch.float32, "cpu")
    batch = decode_batch(pool, rows, [31], [0])
    backend = TritonAttentionBackend(4, 64)
    q = random_q(1, 4, 64, torch.float32, "cpu")
    with forward_context(batch, pool, backend):
        backend.forward(q, torch.empty_like(q), 0, batch, pool)
        assert forward_scratch() == {}
