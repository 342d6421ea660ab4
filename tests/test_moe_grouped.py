"""The grouped-GEMM MoE path (extend sizes) against the torch reference, and when it is taken.

Without a GPU torch's grouped GEMM runs its reference loop on the CPU and the small kernels run
in Triton's interpreter, whose bf16 casts truncate: the whole path is held to the bf16
tolerance there, its kernels to exact fp32 figures; bits and capture are the gpu-marked tests'.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_moe_triton import captured_for_new_routing  # tests/ is on the path: no package

from cgtool.model import moe_grouped, moe_triton
from cgtool.model.moe import experts_ref
from cgtool.model.moe_grouped import (
    GROUPED_MIN_MEAN_ROWS,
    gather_rows,
    grouped_mm_chosen,
    grouped_mm_experts,
    grouped_mm_usable,
    silu_mul_weight,
    sort_pairs,
    sum_sorted_rows,
)
from cgtool.model.moe_triton import CONFIGS, fused_experts

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _routing(num_tokens, num_experts, top_k, seed=0, device=DEVICE):
    gen = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn(num_tokens, num_experts, generator=gen, device=device)
    weights, ids = logits.softmax(-1).topk(top_k, dim=-1)
    return weights, ids.int()


def _experts(num_experts, hidden, inter, seed=1, device=DEVICE):
    gen = torch.Generator(device=device).manual_seed(seed)
    gate_up = torch.randn(num_experts, 2 * inter, hidden, generator=gen, device=device) * hidden**-0.5
    down = torch.randn(num_experts, hidden, inter, generator=gen, device=device) * inter**-0.5
    return gate_up.bfloat16(), down.bfloat16()


@pytest.mark.parametrize(
    "num_tokens,num_experts,top_k,chunk,scan_block",
    # one chunk; 1,600 pairs in 2 chunks; in 100 chunks, scanned 1,024 and 8 at a time
    [(1, 4, 2, 1024, 1024), (37, 8, 3, 1024, 1024), (50, 16, 4, 1024, 1024), (9, 6, 6, 1024, 1024),
     (200, 128, 8, 1024, 1024), (200, 128, 8, 16, 1024), (200, 128, 8, 16, 8)],
)
def test_sort_pairs_orders_by_expert_stably_with_its_inverse_and_ends(
    num_tokens, num_experts, top_k, chunk, scan_block, monkeypatch
):
    monkeypatch.setattr(moe_grouped, "_CHUNK", chunk)
    monkeypatch.setattr(moe_grouped, "_SCAN_BLOCK", scan_block)
    _, ids = _routing(num_tokens, num_experts, top_k, device="cpu")
    order, inverse, ends = sort_pairs(ids, num_experts)
    flat = ids.reshape(-1).long()
    assert torch.equal(order.long(), torch.argsort(flat, stable=True))
    assert torch.equal(order[inverse].long(), torch.arange(flat.numel()))
    assert ends.dtype == torch.int32
    assert torch.equal(ends.long(), torch.bincount(flat, minlength=num_experts).cumsum(0))


def test_gather_rows_takes_each_sorted_pairs_token_row():
    x = torch.randn(11, 40)
    _, ids = _routing(11, 8, 3, device="cpu")
    order, _, _ = sort_pairs(ids, 8)
    assert torch.equal(gather_rows(x, order, 3), x[order // 3])


def test_silu_mul_weight_scales_each_sorted_pair_by_its_routing_weight():
    h = torch.randn(12, 2 * 24)  # fp32: the interpreter's bf16 casts truncate
    weights = torch.rand(12)
    order = torch.randperm(12)
    expected = F.silu(h[:, :24]) * h[:, 24:] * weights[order][:, None]
    torch.testing.assert_close(silu_mul_weight(h, weights, order), expected, rtol=1e-6, atol=1e-6)


def test_sum_sorted_rows_adds_each_tokens_rows_in_slot_order():
    y = torch.randn(5 * 3, 32)
    inverse = torch.randperm(15)
    expected = torch.zeros(5, 32)
    for j in range(3):  # slot order, fp32, as the kernel adds
        expected += y[inverse].view(5, 3, 32)[:, j]
    assert torch.equal(sum_sorted_rows(y, inverse, 3, torch.float32), expected)


@pytest.mark.parametrize("num_tokens,num_experts,top_k", [(37, 8, 3), (64, 16, 4), (5, 4, 4)])
def test_grouped_path_matches_the_reference(num_tokens, num_experts, top_k):
    hidden, inter = 64, 48
    x = torch.randn(num_tokens, hidden, device=DEVICE).bfloat16()
    gate_up, down = _experts(num_experts, hidden, inter)
    weights, ids = _routing(num_tokens, num_experts, top_k)
    out = grouped_mm_experts(x, gate_up, down, weights, ids)
    expected = experts_ref(x.float(), gate_up.float(), down.float(), weights, ids.long())
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("model,num_experts,top_k,grouped_from,triton_at", [
    ("qwen3-30b-a3b", 128, 8, 512, 256),
    ("deepseek-v2-lite", 64, 6, 512, 256),
])
def test_grouped_path_is_chosen_where_the_bench_found_it_faster(model, num_experts, top_k, grouped_from, triton_at):
    # benchmarks/results/h200-2026-11-26-moe-tma/call13 and h100-2026-11-26-moe-tma/call5, call7:
    # from 512 tokens the grouped path was the faster on both GPUs, at 256 the Triton path
    assert grouped_mm_chosen(grouped_from * top_k, num_experts)
    assert not grouped_mm_chosen(triton_at * top_k, num_experts)


def test_the_planners_copy_of_the_grouped_threshold_matches_the_kernels():
    from cgtool.planner.kernel_terms import MOE_GROUPED_MIN_MEAN_ROWS

    assert MOE_GROUPED_MIN_MEAN_ROWS == GROUPED_MIN_MEAN_ROWS


def test_grouped_gemm_takes_bf16_rows_of_whole_16_byte_steps_only():
    x = torch.zeros(2, 8)
    assert not grouped_mm_usable(x, torch.zeros(2, 16, 8))
    assert grouped_mm_usable(x.bfloat16(), torch.zeros(2, 16, 8).bfloat16())
    assert not grouped_mm_usable(torch.zeros(2, 12).bfloat16(), torch.zeros(2, 16, 12).bfloat16())  # hidden 12
    assert not grouped_mm_usable(x.bfloat16(), torch.zeros(2, 12, 8).bfloat16())  # expert width 6


def test_fused_experts_take_the_grouped_path_at_extend_shapes_only(monkeypatch):
    calls = []
    real = moe_triton.grouped_mm_experts
    monkeypatch.setattr(moe_triton, "grouped_mm_experts", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    monkeypatch.setattr(moe_triton, "grouped_mm_usable", lambda x, w: True)
    num_experts, top_k, hidden, inter = 2, 2, 16, 32  # the threshold at 32 tokens
    gate_up, down = _experts(num_experts, hidden, inter)
    needed = GROUPED_MIN_MEAN_ROWS * num_experts // top_k  # tokens where it starts
    for num_tokens in (needed - 1, needed):
        x = torch.randn(num_tokens, hidden, device=DEVICE).bfloat16()
        weights, ids = _routing(num_tokens, num_experts, top_k)
        fused_experts(x, gate_up, down, weights, ids)
        fused_experts(x, gate_up, down, weights, ids, CONFIGS[-1][1])  # a config forces Triton
    assert calls == [needed]


# ---------------------------------------------------------------- GPU: bits and capture


@pytest.mark.gpu
@pytest.mark.parametrize("num_experts,top_k", [(128, 8), (64, 6), (60, 4)])
@pytest.mark.parametrize("num_tokens", [1, 37, 1000, 4099])
def test_sort_pairs_on_the_gpu_orders_as_a_stable_argsort(num_tokens, num_experts, top_k):
    # the GPU's histogram and sort, with a last chunk part full
    _, ids = _routing(num_tokens, num_experts, top_k, device="cuda")
    order, inverse, ends = sort_pairs(ids, num_experts)
    flat = ids.reshape(-1).long()
    assert torch.equal(order.long(), torch.argsort(flat, stable=True))
    assert torch.equal(inverse.long(), torch.argsort(torch.argsort(flat, stable=True)))
    assert torch.equal(ends.long(), torch.bincount(flat, minlength=num_experts).cumsum(0))


@pytest.mark.gpu
@pytest.mark.parametrize("num_experts,top_k,inter", [(128, 8, 768), (64, 6, 1408)])
def test_grouped_path_replays_a_captured_graph_for_new_routing(num_experts, top_k, inter):
    num_tokens, hidden = 4096, 2048
    assert grouped_mm_chosen(num_tokens * top_k, num_experts)
    x = torch.randn(num_tokens, hidden, device="cuda").bfloat16()
    gate_up, down = _experts(num_experts, hidden, inter, device="cuda")
    weights, ids = _routing(num_tokens, num_experts, top_k, device="cuda")
    graph, out = captured_for_new_routing(x, gate_up, down, weights, ids)
    for _ in range(3):
        out.zero_()
        graph.replay()
        assert torch.equal(out, grouped_mm_experts(x, gate_up, down, weights, ids))
    head = 256  # the reference's [tokens, experts, width] intermediate stays small
    expected = experts_ref(x[:head].float(), gate_up.float(), down.float(), weights[:head], ids[:head].long())
    torch.testing.assert_close(out[:head].float(), expected, rtol=2e-2, atol=2e-2)
