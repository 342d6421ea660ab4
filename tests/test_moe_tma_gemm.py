"""cgtool's TMA grouped GEMM against torch on each expert's rows.

Without a GPU the kernel runs in Triton's interpreter, whose tl.dot mishandles bf16: the tests
here run fp32 (exact products, so tight tolerances); bf16, bits against torch's grouped GEMM and
capture are test_moe_grouped's gpu-marked tests, through the whole layer.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from cgtool.model.moe_grouped import silu_mul_weight
from cgtool.model.moe_tma_gemm import _expert_blocks, _expert_major_tile, tma_grouped_mm, tma_usable

# rows per expert: empty experts first, between and last; a group longer than one 128-row block;
# last rows of every tail kind at 64- and 128-row blocks (narrow: at most a quarter block)
COUNTS = [0, 5, 130, 0, 17, 1, 0, 40, 0]
# tail settings: none, half-height tiles, and half-height or narrow transposed ones
TAILS = {"none": {}, "half": {"tail": True}, "narrow": {"tail": True, "narrow_tail": True}}


def _groups(counts, k, n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randn(sum(counts), k, generator=gen)
    weights = torch.randn(len(counts), n, k, generator=gen) * k**-0.5
    ends = torch.tensor(counts).cumsum(0).int()
    return rows, weights, ends


def _per_expert(rows, weights, ends):
    starts = [0] + ends[:-1].tolist()
    return torch.cat([rows[s:e] @ weights[i].T for i, (s, e) in enumerate(zip(starts, ends.tolist()))])


@pytest.mark.parametrize("flatten", [False, True])
@pytest.mark.parametrize("num_programs,block_m", [(1, 128), (3, 128), (3, 64)])
@pytest.mark.parametrize("tail", TAILS)
@pytest.mark.parametrize("warp_specialize", [False, True])
@pytest.mark.parametrize("tile_order", [0, 1])
def test_each_row_times_its_experts_weights(flatten, num_programs, block_m, tail, warp_specialize, tile_order):
    # N = 40 over 32-column tiles reads the next expert's rows, K = 48 over 32 past the tensor;
    # with tails, 130 rows are a 128-row block and a 2-row tail (and 5, 17, 1, 40 tails alone)
    rows, weights, ends = _groups(COUNTS, 48, 40)
    out = tma_grouped_mm(rows, weights, ends, block_m=block_m, block_n=32, block_k=32, flatten=flatten,
                         num_programs=num_programs, warp_specialize=warp_specialize, tile_order=tile_order,
                         **TAILS[tail])
    torch.testing.assert_close(out, _per_expert(rows, weights, ends), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("flatten,tail", [(False, "none"), (True, "none"), (False, "half"), (False, "narrow")])
def test_gated_writes_silu_gate_times_up_times_the_routing_weight(flatten, tail):
    rows, gate_up, ends = _groups(COUNTS, 32, 2 * 24, seed=1)
    pairs = rows.shape[0]
    order = torch.randperm(pairs, generator=torch.Generator().manual_seed(2)).int()
    pair_weights = torch.rand(pairs, generator=torch.Generator().manual_seed(3))
    out = tma_grouped_mm(rows, gate_up, ends, gated=True, pair_weights=pair_weights, order=order,
                         block_n=16, block_k=32, flatten=flatten, num_programs=2, **TAILS[tail])
    expected = silu_mul_weight(_per_expert(rows, gate_up, ends), pair_weights, order)
    assert out.shape == (pairs, 24)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_tma_is_for_the_gpu_with_whole_weights():
    x, w = torch.zeros(4, 8), torch.zeros(2, 8, 8)
    assert not tma_usable(x, w)  # the CPU: torch's grouped GEMM
    if torch.cuda.is_available():
        assert tma_usable(x.cuda(), w.cuda())
        assert not tma_usable(x.cuda(), w.cuda().transpose(1, 2))


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("tail", TAILS)
@pytest.mark.parametrize("tile_order", [0, 1])
def test_gathering_reads_each_sorted_pairs_token_row(gated, tail, tile_order):
    # 3 slots a token; pairs sorted by expert: the kernel reads token order[r] // 3 for row r
    gen = torch.Generator().manual_seed(4)
    tokens = torch.randn(60, 40, generator=gen)
    order = torch.randperm(180, generator=gen).int()
    counts = [0, 50, 0, 129, 1, 0]
    weights = torch.randn(len(counts), 2 * 24 if gated else 24, 40, generator=gen) * 40**-0.5
    ends = torch.tensor(counts).cumsum(0).int()
    pair_weights = torch.rand(180, generator=gen)
    opts = {"gated": gated, "pair_weights": pair_weights, "order": order, "block_n": 16, "block_k": 32,
            "num_programs": 2, "tile_order": tile_order, **TAILS[tail]}
    out = tma_grouped_mm(tokens, weights, ends, gather_top_k=3, **opts)
    expected = tma_grouped_mm(tokens[order.long() // 3], weights, ends, **opts)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize(("name", "mean_rows", "narrow", "down_stages"), [
    ("NVIDIA H100 80GB HBM3", 32, False, 4), ("NVIDIA H100 80GB HBM3", 256, False, 4),
    ("NVIDIA H200", 32, True, 3), ("NVIDIA H200", 63.9, True, 3), ("NVIDIA H200", 64, False, 3),
    ("NVIDIA H200", 256, False, 3)])
def test_launch_settings_follow_the_gpu_class_and_the_rows_measured(monkeypatch, name, mean_rows, narrow, down_stages):
    # the gate/up GEMM: whole tiles in expert-major order, gate and up in one product, but for
    # the H200's narrow tails where an expert has under 64 rows; the H100 keeps a fourth stage in
    # the down GEMM (docs/moe-mla.md)
    from cgtool.model import moe_tma_gemm
    from cgtool.runtime import gpu_class

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: name)
    gpu_class.device_name.cache_clear()
    try:
        gated, down = moe_tma_gemm.launch_tiles(0, mean_rows)
    finally:
        gpu_class.device_name.cache_clear()
    expected = (True, True, 0, False) if narrow else (False, False, 1, True)
    assert (gated["tail"], gated["narrow_tail"], gated["tile_order"], gated["joint_gate_up"]) == expected
    assert not down["tail"] and down.get("tile_order", 0) == 0 and down["num_stages"] == down_stages
    assert (gated["block_n"], down["block_n"]) == (128, 256)


@triton.jit
def _expert_major_tiles(Ends, Out, num_experts, n_tiles, n_total, E_POW2: tl.constexpr, BM: tl.constexpr):
    # each tile's (expert, first row, column tile) as the TMA kernel computes them
    e_ids, starts, ends, blocks, cum, _, _ = _expert_blocks(Ends, num_experts, E_POW2, BM, False)
    for t in range(n_total):
        expert, row0, _, col = _expert_major_tile(t, e_ids, starts, ends, blocks, cum, n_tiles, BM)
        tl.store(Out + 3 * t, expert)
        tl.store(Out + 3 * t + 1, row0)
        tl.store(Out + 3 * t + 2, col)


def test_expert_major_order_puts_one_columns_row_blocks_side_by_side():
    # against the order written out: expert after expert, column after column, the row blocks
    # side by side (so tiles that run at once share a tile of the weights)
    counts, bm, n_tiles = [0, 300, 20, 0, 256, 100], 128, 3
    expected, start = [], 0
    for e, count in enumerate(counts):
        blocks = -(-count // bm)
        expected += [(e, start + b * bm, col) for col in range(n_tiles) for b in range(blocks)]
        start += count
    ends = torch.tensor(counts).cumsum(0).int()
    out = torch.zeros(len(expected), 3, dtype=torch.int32)
    _expert_major_tiles[(1,)](ends, out, len(counts), n_tiles, len(expected), E_POW2=8, BM=bm)
    assert [tuple(row) for row in out.tolist()] == expected


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("flatten", [False, True])
def test_warp_specialized_k_loop_gives_the_ordinary_loops_bits(flatten):
    # bf16 at an extend shape (2,048 rows over 128 experts, K = 768): Triton's warp-specialized
    # K loop (benchmarks/results/h100-2026-11-26-moe-ws, in git history at 532ce70) must not change a bit.
    gen = torch.Generator(device="cuda").manual_seed(0)
    counts = torch.randint(0, 33, (128,), generator=gen, device="cuda")
    ends = counts.cumsum(0).int()
    rows = torch.randn(int(ends[-1]), 768, generator=gen, device="cuda").bfloat16()
    weights = (torch.randn(128, 2048, 768, generator=gen, device="cuda") * 768**-0.5).bfloat16()
    options = {"block_n": 256, "flatten": flatten, "num_stages": 3}
    ordinary = tma_grouped_mm(rows, weights, ends, **options)
    assert torch.equal(tma_grouped_mm(rows, weights, ends, warp_specialize=True, **options), ordinary)


def _gate_up_at_4k(seed: int) -> tuple:
    """(tokens, gate/up weights, ends, gathering options) in bf16 on the GPU at qwen3-30b-a3b's
    4k-token shape: about 256 rows an expert, so an expert's rows fill two or three blocks."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    counts = torch.randint(200, 313, (128,), generator=gen, device="cuda")
    ends = counts.cumsum(0).int()
    pairs = int(ends[-1])
    tokens = torch.randn(pairs // 8 + 1, 2048, generator=gen, device="cuda").bfloat16()
    order = torch.randperm(pairs, generator=gen, device="cuda").int()
    pair_weights = torch.rand(pairs, generator=gen, device="cuda")
    gate_up = (torch.randn(128, 2 * 768, 2048, generator=gen, device="cuda") * 2048**-0.5).bfloat16()
    return tokens, gate_up, ends, {"gated": True, "pair_weights": pair_weights, "order": order, "gather_top_k": 8}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("tail", ["none", "narrow"])
def test_expert_major_tiles_give_the_block_major_bits(tail):
    # the order of the tiles must not change a bit
    tokens, gate_up, ends, options = _gate_up_at_4k(1)
    block_major = tma_grouped_mm(tokens, gate_up, ends, tile_order=0, **options, **TAILS[tail])
    assert torch.equal(tma_grouped_mm(tokens, gate_up, ends, tile_order=1, **options, **TAILS[tail]), block_major)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("tile_order", [0, 1])
def test_joint_gate_up_gives_two_products_bits(tile_order):
    # the gate's and the up's weights in one 128x256 product must not change a bit
    tokens, gate_up, ends, options = _gate_up_at_4k(2)
    two = tma_grouped_mm(tokens, gate_up, ends, joint_gate_up=False, tile_order=tile_order, **options)
    assert torch.equal(tma_grouped_mm(tokens, gate_up, ends, joint_gate_up=True, tile_order=tile_order, **options),
                       two)

@pytest.mark.parametrize("tile_order", [0, 1])
def test_joint_gate_up_takes_gate_and_up_in_one_product(tile_order):
    # the gate's and the up's weights' rows in one box of the [experts, 2, I, K] view: the same
    # output as two products; I = 24 over 16-column tiles leaves the box's last rows past I
    # (interpreter, fp32)
    gen = torch.Generator().manual_seed(5)
    tokens = torch.randn(60, 40, generator=gen)
    order = torch.randperm(180, generator=gen).int()
    counts = [0, 50, 0, 129, 1, 0]
    weights = torch.randn(len(counts), 2 * 24, 40, generator=gen) * 40**-0.5
    ends = torch.tensor(counts).cumsum(0).int()
    opts = {"gated": True, "pair_weights": torch.rand(180, generator=gen), "order": order, "block_n": 16,
            "block_k": 32, "num_programs": 2, "tile_order": tile_order, "gather_top_k": 3}
    joint = tma_grouped_mm(tokens, weights, ends, joint_gate_up=True, **opts)
    torch.testing.assert_close(joint, tma_grouped_mm(tokens, weights, ends, **opts), rtol=1e-6, atol=1e-6)
