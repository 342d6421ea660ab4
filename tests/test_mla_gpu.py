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
        max_bs=48, max_tokens=64, context_len=300, seed=0, kv_tokens=16384,
    )


def test_mla_decode_graphs_replay_equal_to_eager(mla_bench):
    from cgtool.attention import triton_mla
    from cgtool.runners.decode import DecodeGraphRunner

    assert mla_bench.runner.kv_pool.is_latent

    # Up to 16 requests gluon_mla's stage 1 serves on Hopper, from 17 gluon_mla_wgmma's. A
    # padded replay chunks each request's keys with its graph's chunk count, so eager runs with
    # that count: bs 13 in the bs-16 graph, bs 20 in the bs-24 one (at most 11 chunks where 20
    # alone may take 13; gluon_mla_wgmma shares the chunks by the lengths, and its padding's
    # single keys count for none).
    sizes = [1, 2, 4, 8, 16, 24, 32, 48]
    runner = DecodeGraphRunner(mla_bench.runner, sizes)
    runner.capture()
    model = mla_bench.runner.model
    backend = mla_bench.runner.backend
    for bs in (1, 3, 8, 13, 16, 20, 32, 45):
        graph_bs = min(size for size in sizes if size >= bs)
        batch = mla_bench.decode_batch(bs)
        chunks = triton_mla.mla_num_kv_splits(graph_bs, 16)
        backend.num_kv_splits = chunks
        try:
            eager = model.compute_logits(mla_bench.runner.forward_eager(batch))
        finally:
            backend.num_kv_splits = None
        replayed = runner.replay(batch).clone()
        assert replayed.shape == (bs, model.cfg.vocab_size)
        assert_replay_equals_eager(replayed, eager)


def test_a_decode_graphs_replay_counts_the_chunks_it_did_twice(mla_bench):
    # The row `capture` records (kinds._chunks_redone): none on random weights; with the cache
    # scaled far out of the fixed maximum's range, the captured counter's address counts some.
    from functools import partial

    from cgtool.attention import gluon_mla_wgmma
    from cgtool.capture import kinds
    from cgtool.runners.decode import DecodeGraphRunner

    if not gluon_mla_wgmma.counts_redone(mla_bench.runner.device):
        pytest.skip("gluon_mla_wgmma's stage 1 needs Triton's Gluon and a Hopper GPU")
    runner = DecodeGraphRunner(mla_bench.runner, [24])
    runner.capture()
    replay = partial(runner.replay, mla_bench.decode_batch(24))
    assert kinds._chunks_redone(mla_bench, replay) == 0
    cache = mla_bench.runner.kv_pool.k_buffers[0]
    saved = cache.clone()
    try:
        cache.mul_(1000)
        assert kinds._chunks_redone(mla_bench, replay) > 0
    finally:
        cache.copy_(saved)


@pytest.mark.parametrize("num_kv_splits", [1, 4, 8])
def test_mla_decode_merged_by_the_last_program_matches_reference_and_replays_stably(num_kv_splits):
    # 64 requests of 1 to 4,000 tokens: the last program of each request's chunks merges them.
    # 30 replays must give the same bits; a merge that read a chunk too early would not.
    from test_triton_mla import latent_q

    from cgtool.attention.triton_mla import mla_decode_attention

    seq_lens = [(i * 997) % 4000 + 1 for i in range(64)]
    pool, rows = latent_pool(seq_lens, 16, 512, 64, torch.bfloat16, CUDA)
    _, ref = run_decode(pool, rows, seq_lens, 16)
    q = latent_q(64, 16, 576, torch.bfloat16, CUDA).view(64, 16, 576)
    args = (pool.k_buffers[0], None, pool.req_to_token, torch.tensor(rows, dtype=torch.int32, device=CUDA),
            torch.tensor(seq_lens, dtype=torch.int32, device=CUDA), 576**-0.5, num_kv_splits)

    def decode(fused: bool) -> torch.Tensor:
        out = torch.empty(64, 16, 512, dtype=torch.bfloat16, device=CUDA)
        mla_decode_attention(q, args[0], out, *args[2:], fused_merge=fused)
        return out

    fused, merged = decode(True), decode(False)
    torch.testing.assert_close(fused.float(), merged.float(), rtol=0, atol=1e-2)
    out = torch.empty(64, 16, 512, dtype=torch.bfloat16, device=CUDA)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mla_decode_attention(q, args[0], out, *args[2:], fused_merge=True)
    for _ in range(30):
        out.zero_()
        graph.replay()
        torch.testing.assert_close(out, fused, rtol=0, atol=0)
    assert_attention_close(fused.view(64, -1), ref, atol=2e-2)


@pytest.mark.parametrize(("num_kv_splits", "wgmma"), [(4, False), (16, False), (4, True), (16, True)])
def test_mla_decode_traced_gives_the_same_bits_and_ordered_stamps(num_kv_splits, wgmma):
    # The stamps (benchmarks/probe_mla_timeline.py) must not change what triton_mla's kernel
    # computes (they take it, not gluon_mla's, unless gluon_mla_wgmma's is asked for), and each
    # program's stamps must follow its steps: start, row known (for gluon_mla_wgmma: the wait
    # on the kernel before done), loop end, ticket.
    from test_triton_mla import latent_q

    from cgtool.attention import gluon_mla_wgmma
    from cgtool.attention.triton_mla import WGMMA_PROGRAMS, mla_decode_attention
    from cgtool.runtime.kernel_trace import TRACE_SLOTS

    seq_lens = [(i * 389) % 2000 + 1 for i in range(32)]
    pool, rows = latent_pool(seq_lens, 16, 512, 64, torch.bfloat16, CUDA)
    q = latent_q(32, 16, 576, torch.bfloat16, CUDA).view(32, 16, 576)
    args = (pool.req_to_token, torch.tensor(rows, dtype=torch.int32, device=CUDA),
            torch.tensor(seq_lens, dtype=torch.int32, device=CUDA), 576**-0.5, num_kv_splits)
    plain = torch.empty(32, 16, 512, dtype=torch.bfloat16, device=CUDA)
    kernel = {"wgmma": True} if wgmma else {"buffers": 0}
    mla_decode_attention(q, pool.k_buffers[0], plain, *args, **kernel)
    # A program's row each: the grid (32, 1, splits), or gluon_mla_wgmma's flat WGMMA_PROGRAMS + 32.
    programs = WGMMA_PROGRAMS + 32 if wgmma and gluon_mla_wgmma.flat_serves(16) else 32 * num_kv_splits
    trace = torch.zeros(programs, TRACE_SLOTS, dtype=torch.int64, device=CUDA)
    traced = torch.empty_like(plain)
    mla_decode_attention(q, pool.k_buffers[0], traced, *args, trace=trace, **({"wgmma": True} if wgmma else {}))
    torch.testing.assert_close(traced, plain, rtol=0, atol=0)
    stamps = trace.cpu()
    assert (stamps[:, 1] > 0).all()  # every program started and stamped
    looped = stamps[stamps[:, 3] > 0]
    assert len(looped) >= 32  # each request has a nonempty first chunk
    assert (looped[:, 2] >= looped[:, 1]).all() and (looped[:, 3] >= looped[:, 2]).all()
    if wgmma or num_kv_splits <= 8:  # the merge in the last program: one a request, after its ticket
        merged = stamps[stamps[:, 5] > 0]
        # gluon_mla_wgmma writes a one-chunk request's output at once: no ticket, no merge.
        direct = looped[looped[:, 4] == 0] if wgmma else looped[:0]
        assert len(merged) + len(direct) == 32 and (merged[:, 5] >= merged[:, 4]).all()
        assert len(direct) > 0 if wgmma else True  # the short requests here take one chunk



@pytest.mark.parametrize(("prefix", "new"), [(8140, 1), (14_226, 105), (2048, 40)])
def test_mla_extend_bf16_over_a_long_prefix_splits_its_keys_and_matches_reference(prefix, new):
    # deepseek-v2-lite's Mooncake steps: a few new tokens over a long prefix, their keys split
    # as the backend chooses from the SM count, against the torch reference.
    pool, rows = latent_pool([prefix + new, 30], 16, 512, 64, torch.bfloat16, CUDA)
    out, ref = run_extend(pool, rows, [prefix, 0], [new, 30], 16, num_padding=5)
    assert out[new + 30:].eq(0).all()
    assert_attention_close(out[: new + 30], ref[: new + 30], atol=2e-2)


def assert_gluon_stage1_matches_reference_and_replays(seq_lens: list[int], num_heads: int, num_kv_splits: int,
                                                      **stage1) -> None:
    """MLA decode with one of the Gluon stage 1 kernels (`stage1`: mla_decode_attention's
    tiles/buffers or wgmma) against the torch reference; five graph replays give its bits."""
    from test_triton_mla import latent_q

    from cgtool.attention import gluon_mla
    from cgtool.attention.triton_mla import mla_decode_attention

    if not gluon_mla.available(torch.device(CUDA)):
        pytest.skip("Gluon's stage 1 kernels need Triton's Gluon and a Hopper GPU")
    bs = len(seq_lens)
    pool, rows = latent_pool(seq_lens, num_heads, 512, 64, torch.bfloat16, CUDA)
    _, ref = run_decode(pool, rows, seq_lens, num_heads)
    q = latent_q(bs, num_heads, 576, torch.bfloat16, CUDA).view(bs, num_heads, 576)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=CUDA)
    args = (pool.k_buffers[0], None, pool.req_to_token, torch.tensor(rows, dtype=torch.int32, device=CUDA),
            lens, 576**-0.5, num_kv_splits)
    out = torch.zeros(bs, num_heads, 512, dtype=torch.bfloat16, device=CUDA)
    mla_decode_attention(q, args[0], out, *args[2:], **stage1)
    assert_attention_close(out.view(bs, -1), ref, atol=2e-2)
    graph = torch.cuda.CUDAGraph()
    replayed = torch.zeros_like(out)
    with torch.cuda.graph(graph):
        mla_decode_attention(q, args[0], replayed, *args[2:], **stage1)
    for _ in range(5):
        replayed.zero_()
        graph.replay()
        torch.testing.assert_close(replayed, out, rtol=0, atol=0)


@pytest.mark.parametrize(("num_heads", "tiles", "buffers", "num_kv_splits"),
                         [(16, (64, 8, 1), 2, 4), (16, (32, 4, 1), 2, 8), (16, (32, 4, 1), 3, 1),
                          (16, (16, 4, 1), 4, 16), (20, (32, 4, 1), 2, 4), (128, (64, 8, 1), 2, 2)])
def test_mla_decode_with_buffered_stage1_matches_reference_and_replays(num_heads, tiles, buffers, num_kv_splits):
    # gluon_mla's stage 1 over requests of 1 to 9,000 tokens (chunks shorter than the copies in
    # flight, a last block cut short, a partial head block at 20 heads), merged by the merge kernel.
    assert_gluon_stage1_matches_reference_and_replays([1, 2, 31, 33, 64, 65, 1000, 9000, 513, 17], num_heads,
                                                      num_kv_splits, tiles=tiles, buffers=buffers, wgmma=False)


MIXED = [1, 2, 31, 63, 64, 65, 129, 1000, 9000, 513, 17]
PADDED = [2000] * 20 + [1] * 30  # 20 requests in a graph of 50, as a replay pads them
# One long request among short ones: its share of the programs is past the grid's chunk cap.
SKEWED = [16_000] + [300] * 40


@pytest.mark.parametrize(("num_heads", "num_kv_splits", "seq_lens"), [
    (16, 1, MIXED), (16, 4, MIXED), (16, 8, MIXED), (16, 16, MIXED), (20, 4, MIXED), (128, 2, MIXED),
    (16, 5, PADDED), (16, 6, SKEWED)])
def test_mla_decode_with_wgmma_stage1_matches_reference_and_replays(num_heads, num_kv_splits, seq_lens):
    # gluon_mla_wgmma's stage 1: chunks of whole 64-key tiles shared by the batch's lengths (a
    # 9,000-token request beside short ones, long ones beside padding), a last tile cut short,
    # chunks left empty, a partial head block at 20 heads; merged by the last program.
    assert_gluon_stage1_matches_reference_and_replays(seq_lens, num_heads, num_kv_splits, wgmma=True)


def _scores_out_of_range(pool, rows: list[int], seq_lens: list[int], q: torch.Tensor, kind: str) -> None:
    """Keys rewritten so that a fixed maximum's first pass leaves fp32's range: "spike", a few
    keys far above the rest in later tiles (their p overflows); "sunk", every score near -200
    nats (every p flushes to zero); "wide", the whole cache scaled up (scores of +-200 nats)."""
    buf = pool.k_buffers[0]
    for b, (row, n) in enumerate(zip(rows, seq_lens)):
        slots = pool.req_to_token[row, :n].long()
        if kind == "spike":
            picked = slots[[i for i in (70, 333, 700, 5000) if i < n]]
            buf[picked] = (buf[picked].float() * 60).to(buf.dtype)
        elif kind == "sunk":
            towards = q[b].float().sum(0)
            buf[slots] = (buf[slots].float() - 400 * towards / towards.norm()).to(buf.dtype)
        else:
            buf[slots] = (buf[slots].float() * 50).to(buf.dtype)


@pytest.mark.parametrize("kind", ["spike", "sunk", "wide"])
@pytest.mark.parametrize("fixed_max", [True, False])
def test_wgmma_fixed_maximum_redoes_a_chunk_whose_scores_leave_its_range(monkeypatch, fixed_max, kind):
    # FIXED_MAX scales a chunk's tiles by the maximum 0; where the scores leave fp32's range
    # around it (p overflows to inf or flushes to 0, by construction here) the sums of p say so
    # and the chunk is done again with a running maximum. Without that second pass the output
    # would hold inf, NaN or zero rows. False, the running maximum alone, is the control. Each
    # chunk done again is counted (attention.redone_chunks): "sunk" sends every chunk there.
    from test_triton_mla import latent_q

    from cgtool.attention import gluon_mla, gluon_mla_wgmma, redone_chunks, triton_mla
    from cgtool.attention.mla_flat_plan import flat_plan_ref
    from cgtool.attention.torch_ref import TorchAttentionBackend
    from cgtool.attention.triton_mla import mla_decode_attention
    from cgtool.runtime.engine import decode_batch

    if not gluon_mla.available(torch.device(CUDA)):
        pytest.skip("gluon_mla_wgmma's stage 1 needs Triton's Gluon and a Hopper GPU")
    monkeypatch.setattr(gluon_mla_wgmma, "FIXED_MAX", fixed_max)
    seq_lens = [1000] * 17 + [9000, 129, 65, 1]
    bs = len(seq_lens)
    pool, rows = latent_pool(seq_lens, 16, 512, 64, torch.bfloat16, CUDA)
    q = latent_q(bs, 16, 576, torch.bfloat16, CUDA)
    _scores_out_of_range(pool, rows, seq_lens, q.view(bs, 16, 576), kind)
    ref = torch.full((bs, 16 * 512), float("nan"), dtype=torch.bfloat16, device=CUDA)
    batch = decode_batch(pool, rows, [n - 1 for n in seq_lens], [0] * bs)
    TorchAttentionBackend(16, 576).forward(q, ref, 0, batch, pool)
    out = torch.full((bs, 16, 512), float("nan"), dtype=torch.bfloat16, device=CUDA)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=CUDA)
    redone_chunks.reset(CUDA)
    mla_decode_attention(q.view(bs, 16, 576), pool.k_buffers[0], out, pool.req_to_token,
                         torch.tensor(rows, dtype=torch.int32, device=CUDA), lens, 576**-0.5, 8, wgmma=True)
    assert not gluon_mla_wgmma.refused()
    redone = redone_chunks.read(CUDA)
    _, requests = flat_plan_ref(seq_lens, rows, triton_mla.WGMMA_PROGRAMS, triton_mla.WGMMA_MIN_CHUNK,
                                gluon_mla_wgmma.WGMMA_TILES[0])
    chunks = sum(count for _, count in requests)
    if not fixed_max:
        assert redone == 0
    elif kind == "sunk":
        assert redone == chunks
    else:
        assert 0 < redone <= chunks
    out, ref = out.view(bs, -1).float(), ref.float()
    assert torch.isfinite(out).all()
    scale = ref.abs().amax(1, keepdim=True)  # the rows' own magnitude: a spike's value rows are 60x
    torch.testing.assert_close(out / scale, ref / scale, atol=2e-2, rtol=0)


def test_wgmma_fixed_maximum_redoes_no_chunk_of_random_caches():
    # The presets' and tests' random weights keep every score inside the fixed maximum's range.
    from test_triton_mla import latent_q

    from cgtool.attention import gluon_mla, gluon_mla_wgmma, redone_chunks
    from cgtool.attention.triton_mla import mla_decode_attention

    if not gluon_mla.available(torch.device(CUDA)):
        pytest.skip("gluon_mla_wgmma's stage 1 needs Triton's Gluon and a Hopper GPU")
    assert gluon_mla_wgmma.counts_redone(torch.device(CUDA))
    for seq_lens in (MIXED, PADDED, SKEWED):
        bs = len(seq_lens)
        pool, rows = latent_pool(seq_lens, 16, 512, 64, torch.bfloat16, CUDA)
        q = latent_q(bs, 16, 576, torch.bfloat16, CUDA).view(bs, 16, 576)
        out = torch.zeros(bs, 16, 512, dtype=torch.bfloat16, device=CUDA)
        redone_chunks.reset(CUDA)
        mla_decode_attention(q, pool.k_buffers[0], out, pool.req_to_token,
                             torch.tensor(rows, dtype=torch.int32, device=CUDA),
                             torch.tensor(seq_lens, dtype=torch.int32, device=CUDA), 576**-0.5, 8, wgmma=True)
        assert redone_chunks.read(CUDA) == 0


def assert_wgmma_setting_keeps_the_bits(monkeypatch, setting: str, num_kv_splits: int, seq_lens: list[int]) -> None:
    """gluon_mla_wgmma's output with the module constant `setting` on and off: the same bits."""
    from test_triton_mla import latent_q

    from cgtool.attention import gluon_mla, gluon_mla_wgmma
    from cgtool.attention.triton_mla import mla_decode_attention

    if not gluon_mla.available(torch.device(CUDA)):
        pytest.skip("Gluon's stage 1 kernels need Triton's Gluon and a Hopper GPU")
    bs = len(seq_lens)
    pool, rows = latent_pool(seq_lens, 16, 512, 64, torch.bfloat16, CUDA)
    q = latent_q(bs, 16, 576, torch.bfloat16, CUDA).view(bs, 16, 576)
    args = (pool.req_to_token, torch.tensor(rows, dtype=torch.int32, device=CUDA),
            torch.tensor(seq_lens, dtype=torch.int32, device=CUDA), 576**-0.5, num_kv_splits)
    outs = {}
    for value in (True, False):
        monkeypatch.setattr(gluon_mla_wgmma, setting, value)
        outs[value] = torch.zeros(bs, 16, 512, dtype=torch.bfloat16, device=CUDA)
        mla_decode_attention(q, pool.k_buffers[0], outs[value], *args, wgmma=True)
    assert not gluon_mla_wgmma.refused()
    torch.testing.assert_close(outs[True], outs[False], rtol=0, atol=0)


@pytest.mark.parametrize("setting", ["ONE_CHUNK_DIRECT", "SPARES_FIRST"])
@pytest.mark.parametrize(("num_kv_splits", "seq_lens"), [(4, MIXED), (5, PADDED), (2, [1024] * 128), (1, [1024] * 40)])
def test_wgmma_settings_that_keep_the_bits_keep_them(monkeypatch, setting, num_kv_splits, seq_lens):
    # ONE_CHUNK_DIRECT skips the partial, ticket and merge of a one-chunk request; the merge of
    # one chunk rounds that chunk's output once, as the direct store does. SPARES_FIRST orders
    # the grid's launch only: a chunk's keys and the merge's order do not depend on it.
    assert_wgmma_setting_keeps_the_bits(monkeypatch, setting, num_kv_splits, seq_lens)


@pytest.mark.parametrize("seq_lens", [[1024] * 17, [1024] * 32, [700] * 48, [1024] * 128, [2000] * 20 + [1] * 13])
def test_flat_chunks_keep_the_bits_where_the_grid_did_not_cap_them(monkeypatch, seq_lens):
    # gluon_mla_wgmma's flat programs ask for the chunks the grid's did, uncapped; at the chunk
    # counts mla_num_kv_splits gives, equal lengths (and padding) never reach the cap, so every
    # request gets the same chunks and the merge the same partials in the same order.
    from cgtool.attention.triton_mla import mla_num_kv_splits

    assert_wgmma_setting_keeps_the_bits(monkeypatch, "FLAT_CHUNKS", mla_num_kv_splits(len(seq_lens), 16), seq_lens)


def assert_store_then_attention_replays(layers, outs: list[torch.Tensor], expected: torch.Tensor) -> None:
    """`layers` (each a store then an attention into one of `outs`) run eagerly, then captured in
    a graph and replayed 20 times: every output the bits of `expected` each time."""
    layers()
    for out in outs:
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layers()
    for _ in range(20):
        for out in outs:
            out.zero_()
        graph.replay()
        for out in outs:
            torch.testing.assert_close(out, expected, rtol=0, atol=0)


# Lengths around the 64-key tile: a first tile that holds the newest key and one that does not.
STORED = [1, 2, 31, 32, 33, 64, 65, 300, 1000, 4097, 513, 17]


@dataclasses.dataclass
class StoredBatch:
    """A decode batch over a latent pool whose newest row a request is stored as a layer stores it."""

    pool: object
    rows: list[int]
    pool_rows: torch.Tensor
    lens: torch.Tensor
    loc: torch.Tensor  # the newest rows' slots
    new_rows: torch.Tensor  # [bs, 1, 576]
    q: torch.Tensor  # [bs, 16, 576]

    @property
    def args(self) -> tuple:
        """decode_projected's arguments after `out`: the pool's rows, lengths and scale."""
        return self.pool.req_to_token, self.pool_rows, self.lens, 576**-0.5

    def store(self) -> None:
        """The newest rows' slots NaN, then kv_store's store, so a row read before it shows."""
        from cgtool.runtime.kv_store import store_kv

        cache = self.pool.k_buffers[0]
        cache.index_fill_(0, self.loc, float("nan"))
        store_kv(cache, None, self.loc, self.new_rows, None)


def stored_batch(seq_lens: list[int], heads: int = 16) -> StoredBatch:
    from test_triton_mla import latent_q

    bs = len(seq_lens)
    pool, rows = latent_pool(seq_lens, heads, 512, 64, torch.bfloat16, CUDA)
    pool_rows = torch.tensor(rows, dtype=torch.int32, device=CUDA)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=CUDA)
    loc = pool.req_to_token[pool_rows.long(), lens.long() - 1].long()
    batch = StoredBatch(pool, rows, pool_rows, lens, loc, torch.randn(bs, 1, 576, device=CUDA).to(torch.bfloat16),
                        latent_q(bs, heads, 576, torch.bfloat16, CUDA).view(bs, heads, 576))
    pool.k_buffers[0][loc] = batch.new_rows
    return batch


def up_projection(heads: int = 16) -> torch.Tensor:
    """w_uv [heads, 128, 512], rows at a stride as a model's slice of its kv_b_proj."""
    return (torch.randn(heads, 256, 512, device=CUDA) / 512**0.5).to(torch.bfloat16)[:, 128:]


def projection_case(monkeypatch, seq_lens: list[int], gluon: bool) -> tuple[StoredBatch, torch.Tensor]:
    """A stored batch of deepseek-v2-lite's 16 heads and an up-projection for the merge in the
    value projection, its Gluon kernel or its Triton one (GLUON_KERNEL); skipped where
    gluon_mla_wgmma's stage 1 cannot run."""
    from cgtool.attention import gluon_mla, mla_merge_projection

    if not gluon_mla.available(torch.device(CUDA)):
        pytest.skip("gluon_mla_wgmma's stage 1 needs Triton's Gluon and a Hopper GPU")
    monkeypatch.setattr(mla_merge_projection, "GLUON_KERNEL", gluon)
    return stored_batch(seq_lens), up_projection()


@pytest.mark.parametrize(("num_kv_splits", "seq_lens", "early"), [
    (4, STORED, False), (16, STORED, False),
    # gluon_mla_wgmma (17 requests on), its first tile's copies before or after the wait
    (4, STORED + [1024] * 10, False), (4, STORED + [1024] * 10, True), (4, STORED + [65] * 36, True)])
def test_mla_decode_after_the_store_attends_the_stored_rows(monkeypatch, num_kv_splits, seq_lens, early):
    # As a layer runs it: each request's new row stored, then attended by a stage 1 that the
    # store releases at once (a dependent launch where they run). Before each store the new
    # rows' slots hold NaN, so a row read before the store wrote it shows. Eight such layers
    # in a graph, 20 replays, each the bits of the attention run alone.
    from cgtool.attention import gluon_mla_wgmma
    from cgtool.attention.triton_mla import mla_decode_attention

    monkeypatch.setattr(gluon_mla_wgmma, "EARLY_COPIES", early)
    bs, batch = len(seq_lens), stored_batch(seq_lens)
    cache = batch.pool.k_buffers[0]
    args = (*batch.args, num_kv_splits)
    _, ref = run_decode(batch.pool, batch.rows, seq_lens, 16)
    expected = torch.empty(bs, 16, 512, dtype=torch.bfloat16, device=CUDA)
    mla_decode_attention(batch.q, cache, expected, *args)
    assert_attention_close(expected.view(bs, -1), ref, atol=2e-2)

    outs = [torch.empty_like(expected) for _ in range(8)]

    def layers() -> None:
        memo: dict = {}  # one forward's: its first layer plans the flat chunks, the rest read them
        for out in outs:
            batch.store()
            mla_decode_attention(batch.q, cache, out, *args, memo=memo)

    assert_store_then_attention_replays(layers, outs, expected)


@pytest.mark.parametrize("gluon", [False, True])
@pytest.mark.parametrize("early", [False, True])
@pytest.mark.parametrize("seq_lens", [STORED + [1024] * 10, STORED + [65] * 36, STORED, [4097], [33, 1000, 8192]])
def test_merge_in_the_value_projection_after_the_store_attends_the_stored_rows(monkeypatch, seq_lens, early,
                                                                               gluon):
    # The store, then stage 1 unmerged and the value projection that merges (bs 1-66), the new
    # rows' slots NaN before each store; stage 1's first tile copied before or after its wait.
    # Eight layers in a graph, 20 replays, each the bits of the same calls run eagerly.
    from cgtool.attention import gluon_mla_wgmma
    from cgtool.attention.mla_merge_projection import decode_projected

    batch, w_uv = projection_case(monkeypatch, seq_lens, gluon)
    monkeypatch.setattr(gluon_mla_wgmma, "EARLY_COPIES", early)
    cache = batch.pool.k_buffers[0]
    args = batch.args
    expected = torch.empty(len(seq_lens), 16 * 128, dtype=torch.bfloat16, device=CUDA)
    assert decode_projected(batch.q, cache, w_uv, expected, *args)
    assert not expected.isnan().any()
    outs = [torch.empty_like(expected) for _ in range(8)]

    def layers() -> None:
        memo: dict = {}  # one forward's: its first layer plans the flat chunks, the rest read them
        for out in outs:
            batch.store()
            decode_projected(batch.q, cache, w_uv, out, *args, memo=memo)

    assert_store_then_attention_replays(layers, outs, expected)


@pytest.mark.parametrize("seq_lens", [MIXED + [700] * 9, PADDED, SKEWED, [1024] * 66, [300] * 17, MIXED, [1024] * 5,
                                      [300] * 7 + [9000], [1024] * 22, [2048] * 12, [2048] * 6 + [512] * 6,
                                      [1], [8192], [4096] * 2, [300, 9000], [2048] * 3, [8192] * 4, [1024] * 4])
@pytest.mark.parametrize("gluon", [False, True])
def test_merge_in_the_value_projection_matches_attention_then_product_and_replays(monkeypatch, seq_lens, gluon):
    # mla_merge_projection: gluon_mla_wgmma's chunks left unmerged, merged as the value
    # projection loads them (bs 1-66). Against the torch reference's attention times each
    # head's up-projection, against the separate merge and product, and over 10 replays of a
    # graph, the same bits each time. Padding, one long request, chunks of one tile (bs 17 x 300),
    # a plan over fewer programs than stage 1's (bs 22 x 1k, 12 x 2k: plan_programs), programs of
    # 48 slots (6 x 2k + 6 x 512: the Gluon kernel's WIDE_STEP); one to four requests, one
    # request's 32 chunks in one step of slots (bs 1 x 8k: a plan of 32 programs), one key.
    # The projection's Triton kernel or its Gluon one (GLUON_KERNEL).
    from cgtool.attention.mla_merge_projection import decode_projected
    from cgtool.attention.triton_mla import mla_decode_attention, mla_num_kv_splits

    batch, w_uv = projection_case(monkeypatch, seq_lens, gluon)
    bs, heads, v = len(seq_lens), 16, 128
    pool, q = batch.pool, batch.q
    _, ref = run_decode(pool, batch.rows, seq_lens, heads)
    args = batch.args
    fused = torch.empty(bs, heads * v, dtype=torch.bfloat16, device=CUDA)
    assert decode_projected(q, pool.k_buffers[0], w_uv, fused, *args)
    want = torch.einsum("bhr,hvr->bhv", ref.view(bs, heads, 512).float(), w_uv.float()).reshape(bs, -1)
    torch.testing.assert_close(fused.float(), want, rtol=2e-2, atol=2e-2)
    apart = torch.empty(bs, heads, 512, dtype=torch.bfloat16, device=CUDA)
    mla_decode_attention(q, pool.k_buffers[0], apart, *args, mla_num_kv_splits(bs, heads))
    product = torch.einsum("bhr,hvr->bhv", apart.float(), w_uv.float()).reshape(bs, -1)
    torch.testing.assert_close(fused.float(), product, rtol=2e-2, atol=2e-2)
    out = torch.empty_like(fused)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode_projected(q, pool.k_buffers[0], w_uv, out, *args)
    for _ in range(10):
        out.zero_()
        graph.replay()
        torch.testing.assert_close(out, fused, rtol=0, atol=0)


@pytest.mark.parametrize("gluon", [False, True])
@pytest.mark.parametrize("seq_lens", [[4096] * 8, [1024] * 32, [300] * 7 + [9000], [2048] * 6 + [512] * 6])
def test_merge_in_the_value_projection_traced_gives_the_same_bits_and_ordered_stamps(monkeypatch, seq_lens, gluon):
    # The projection's stamps (benchmarks/probe_mla_projection_timeline.py) must not change what
    # it computes, and each program's must follow its steps: start, plan loaded, wait on stage 1
    # returned, merged, multiplied; the wait returns after every stage 1 program's loop ended.
    # Many chunks a request (the merge over slots), four or fewer (the step of four), a mix; the
    # Triton kernel and the Gluon one.
    from cgtool.attention import triton_mla
    from cgtool.attention.mla_merge_projection import decode_projected, projection_programs
    from cgtool.runtime.kernel_trace import TRACE_SLOTS

    batch, w_uv = projection_case(monkeypatch, seq_lens, gluon)
    bs, heads, v = len(seq_lens), 16, 128
    pool, q = batch.pool, batch.q
    args = batch.args
    plain = torch.empty(bs, heads * v, dtype=torch.bfloat16, device=CUDA)
    assert decode_projected(q, pool.k_buffers[0], w_uv, plain, *args)
    stage1 = torch.zeros(triton_mla.WGMMA_PROGRAMS + bs, TRACE_SLOTS, dtype=torch.int64, device=CUDA)
    projection = torch.zeros(projection_programs(bs, heads, v), TRACE_SLOTS, dtype=torch.int64, device=CUDA)
    traced = torch.empty_like(plain)
    assert decode_projected(q, pool.k_buffers[0], w_uv, traced, *args, trace=stage1, projection_trace=projection)
    torch.testing.assert_close(traced, plain, rtol=0, atol=0)
    stamps = projection.cpu()
    assert (stamps[:, 1] > 0).all()  # every program started and stamped
    assert all((stamps[:, i + 1] >= stamps[:, i]).all() for i in range(1, 5))
    loops_end = stage1.cpu()[:, 3].max()
    assert loops_end > 0 and (stamps[:, 3] >= loops_end).all()
    # The Gluon kernel also stamps its merge over slots' last step: partials in shared memory,
    # then its products, between the wait's return and the merged stamp (8 x 4k merges so, and
    # 6 x 2k's programs of 48 slots in their two steps).
    stepped = stamps[stamps[:, 6] > 0]
    if gluon and seq_lens in ([4096] * 8, [2048] * 6 + [512] * 6):
        assert len(stepped) > 0
    assert ((stepped[:, 6] >= stepped[:, 3]) & (stepped[:, 7] >= stepped[:, 6]) & (stepped[:, 4] >= stepped[:, 7])).all()


@pytest.mark.parametrize("gluon", [False, True])
@pytest.mark.parametrize("seq_lens", [[1024] * 24, MIXED + [700] * 9, MIXED, [2048] * 12])
def test_a_replay_plans_its_new_lengths_once_for_all_its_layers(monkeypatch, seq_lens, gluon):
    # Four layers of decode_projected in a graph share one plan of the flat chunks (the first
    # plans, the rest read it before their wait) and, as a model's layers do, one block of
    # partials. Replayed with other lengths written into the same tensor, each layer's output is
    # the bits of an eager call at those lengths; each layer has a query of its own, so a
    # projection that read the partials before its stage 1 stored them would read another
    # layer's or replay's.
    from test_triton_mla import latent_q

    from cgtool.attention.mla_merge_projection import decode_projected

    batch, w_uv = projection_case(monkeypatch, seq_lens, gluon)
    bs, heads = len(seq_lens), 16
    pool, lens = batch.pool, batch.lens
    qs = [batch.q] + [latent_q(bs, heads, 576, torch.bfloat16, CUDA).view(bs, heads, 576) for _ in range(3)]
    args = batch.args
    outs = [torch.empty(bs, heads * 128, dtype=torch.bfloat16, device=CUDA) for _ in range(4)]

    def layers() -> None:
        memo: dict = {}
        scratch: dict = {}
        for q, out in zip(qs, outs, strict=True):
            assert decode_projected(q, pool.k_buffers[0], w_uv, out, *args, scratch=scratch, memo=memo)

    layers()  # compiles
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layers()
    for new_lens in (seq_lens, [max(1, n // 3) for n in seq_lens], [n - (i % 5) * 60 for i, n in enumerate(seq_lens)]):
        lens.copy_(torch.tensor([max(1, n) for n in new_lens], dtype=torch.int32))
        expected = [torch.empty_like(outs[0]) for _ in qs]
        for q, want in zip(qs, expected, strict=True):
            assert decode_projected(q, pool.k_buffers[0], w_uv, want, *args)
        for out in outs:
            out.zero_()
        graph.replay()
        for out, want in zip(outs, expected, strict=True):
            torch.testing.assert_close(out, want, rtol=0, atol=0)


def test_merge_in_the_value_projection_serves_from_1_to_66_requests():
    # Past 66 requests a request of 1k keys has one chunk, written at once with no merge to save.
    # Below 5 gluon_mla's stage 1 and its merge kernel were faster until 2026-11-28, no longer.
    from cgtool.attention import gluon_mla
    from cgtool.attention.mla_merge_projection import serves

    if not gluon_mla.available(torch.device(CUDA)):
        pytest.skip("gluon_mla_wgmma's stage 1 needs Triton's Gluon and a Hopper GPU")
    w_uv = torch.empty(16, 128, 512, dtype=torch.bfloat16, device=CUDA)
    served = [bs for bs in range(1, 140) if serves(torch.empty(bs, 16, 576, device=CUDA), w_uv)]
    assert served == list(range(1, 67))
