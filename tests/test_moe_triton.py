"""The fused Triton MoE against the torch reference that runs every expert.

Without a GPU the kernels run in Triton's interpreter (conftest sets TRITON_INTERPRET) on
small fp32 shapes; the interpreter's tl.dot mishandles bf16, so bf16 and capture are
checked by the gpu-marked tests.
"""

from __future__ import annotations

import pytest
import torch

from cgtool.model.moe import Experts, SparseMoE, experts_ref, route, use_moe_backend
from cgtool.model.moe_routing import ONE_PROGRAM_PAIRS, route_topk, router_logits
from cgtool.model.moe_triton import (
    CONFIGS,
    align_block_size,
    block_m_for,
    experts_config,
    fused_experts,
    max_padded_pairs,
)
from cgtool.specs.config_parts import MoeConfig

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# (num_experts, top_k, num_tokens): one token; counts not a multiple of the 16-row block;
# top_k equal to the expert count; enough pairs per expert for a 64-row block.
CASES = [(4, 1, 1), (8, 2, 1), (8, 2, 5), (16, 4, 33), (6, 6, 3), (4, 2, 130)]
# Past ONE_PROGRAM_PAIRS the alignment spreads over many programs.
SPREAD_CASE = (16, 4, ONE_PROGRAM_PAIRS // 4 + 37)


def _routing(num_tokens, num_experts, top_k, seed=0, device=DEVICE):
    gen = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn(num_tokens, num_experts, generator=gen, device=device)
    weights, ids = logits.softmax(-1).topk(top_k, dim=-1)
    return weights, ids


def _experts(num_experts, hidden, inter, dtype, seed=1, device=DEVICE):
    gen = torch.Generator(device=device).manual_seed(seed)
    gate_up = torch.randn(num_experts, 2 * inter, hidden, generator=gen, device=device) * hidden**-0.5
    down = torch.randn(num_experts, hidden, inter, generator=gen, device=device) * inter**-0.5
    return gate_up.to(dtype), down.to(dtype)


# ---------------------------------------------------------------- alignment


@pytest.mark.parametrize("num_experts,top_k,num_tokens", CASES + [SPREAD_CASE])
def test_align_puts_every_pair_once_in_a_block_of_its_expert(num_experts, top_k, num_tokens):
    _, ids = _routing(num_tokens, num_experts, top_k)
    block_m = block_m_for(ids.numel(), num_experts)
    sorted_pair_ids, block_experts, num_padded = align_block_size(ids, num_experts, block_m)
    used = int(num_padded.item())
    assert used % block_m == 0 and used <= sorted_pair_ids.numel()
    pairs = sorted_pair_ids[:used].long()
    real = pairs < ids.numel()
    assert sorted(pairs[real].tolist()) == list(range(ids.numel()))
    assert (sorted_pair_ids[used:] == ids.numel()).all()  # past the total: padding only
    expert_of_row = block_experts.long().repeat_interleave(block_m)[:used]
    assert torch.equal(ids.flatten()[pairs[real]], expert_of_row[real])


def test_align_shapes_depend_on_the_token_count_not_the_routing():
    num_experts, top_k, num_tokens, block_m = 8, 2, 9, 16
    spread = _routing(num_tokens, num_experts, top_k)[1]
    skewed = torch.stack([torch.zeros(num_tokens), torch.ones(num_tokens)], dim=1).long().to(DEVICE)
    shapes = [
        [t.shape for t in align_block_size(ids, num_experts, block_m)] for ids in (spread, skewed)
    ]
    assert shapes[0] == shapes[1]
    assert shapes[0][0][0] == max_padded_pairs(num_tokens * top_k, num_experts, block_m)


def test_max_padded_pairs_bounds_one_partial_block_per_routed_expert():
    # 1 token, top 8 of 128 experts: 8 experts at most, each padded to one 16-row block.
    assert max_padded_pairs(8, 128, 16) == 8 * 16
    # More pairs than experts: each of the 4 experts pads by at most 15 rows.
    assert max_padded_pairs(100, 4, 16) == 160


def test_block_m_follows_the_mean_rows_an_expert_gets():
    # decode of qwen3-30b-a3b up to bs 64 (4 rows an expert) keeps the 16-row block that
    # tl.dot needs at least; an 8k-token extend (512 rows an expert) takes the widest.
    assert block_m_for(8, 128) == 16 and block_m_for(64 * 8, 128) == 16
    assert block_m_for(8192 * 8, 128) == max(config.block_m for _, config in CONFIGS)
    sizes = [experts_config(n * 8, 128).block_m for n in range(1, 9000, 37)]
    assert sizes == sorted(sizes)


@pytest.mark.parametrize("renormalise,scale", [(True, 1.0), (False, 2.5)])
@pytest.mark.parametrize("num_tokens,num_experts,top_k", [(1, 8, 2), (19, 64, 6), (5, 128, 8), (3, 6, 6)])
def test_route_topk_kernel_matches_the_torch_routing(renormalise, scale, num_tokens, num_experts, top_k):
    gen = torch.Generator(device=DEVICE).manual_seed(3)
    logits = torch.randn(num_tokens, num_experts, generator=gen, device=DEVICE)
    moe = MoeConfig(num_experts=num_experts, top_k=top_k, expert_intermediate_size=8,
                    norm_topk_prob=renormalise, routed_scaling_factor=scale)
    weights, ids = route_topk(logits, top_k, renormalise, scale)
    ref_weights, ref_ids = route(logits, moe)
    assert ids.dtype == torch.int32 and torch.equal(ids.long(), ref_ids)
    torch.testing.assert_close(weights, ref_weights, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("num_tokens,num_experts,hidden", [(1, 8, 48), (19, 64, 200), (70, 6, 32)])
def test_router_logits_kernel_matches_the_fp32_linear(num_tokens, num_experts, hidden):
    gen = torch.Generator(device=DEVICE).manual_seed(4)
    x = torch.randn(num_tokens, hidden, generator=gen, device=DEVICE)
    w = torch.randn(num_experts, hidden, generator=gen, device=DEVICE)
    torch.testing.assert_close(router_logits(x, w), torch.nn.functional.linear(x, w), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("num_experts,top_k,hidden", [(8, 2, 48), (64, 6, 300), (6, 6, 32), (128, 8, 2100)])
@pytest.mark.parametrize("renormalise", [True, False])
def test_router_and_routing_in_one_launch_match_the_two_kernels(num_experts, top_k, hidden, renormalise):
    # 64 experts over 16 programs; hidden 2100 takes two slices of the row. The last program
    # routes the token and leaves its counter at zero for the next launch.
    from cgtool.model.moe_routing import router_route
    from cgtool.runtime.tickets import tickets

    gen = torch.Generator(device=DEVICE).manual_seed(5)
    x = torch.randn(1, hidden, generator=gen, device=DEVICE)
    w = torch.randn(num_experts, hidden, generator=gen, device=DEVICE)
    weights, ids = router_route(x, w, top_k, renormalise, 1.5)
    ref_weights, ref_ids = route_topk(router_logits(x, w), top_k, renormalise, 1.5)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_weights, rtol=1e-5, atol=1e-6)
    assert tickets(DEVICE, 1).item() == 0


def test_routing_by_rank_breaks_ties_as_rounds_of_argmax():
    # Equal logits: the lower expert comes first, as torch.topk and the argmax rounds order them.
    from cgtool.model.moe_routing import router_route

    x = torch.ones(1, 16, device=DEVICE)
    w = torch.zeros(8, 16, device=DEVICE)
    w[[1, 3, 6, 7], :] = 1.0  # four experts tie at the top
    weights, ids = router_route(x, w, 3, True, 1.0)
    ref_weights, ref_ids = route_topk(router_logits(x, w), 3, True, 1.0)
    assert ids.tolist() == ref_ids.tolist() == [[1, 3, 6]]
    torch.testing.assert_close(weights, ref_weights, rtol=1e-6, atol=1e-7)


def test_fused_route_takes_one_launch_for_one_token_only(monkeypatch):
    from cgtool.model import moe_routing

    calls = []
    monkeypatch.setattr(moe_routing, "router_route", lambda *a, **k: calls.append("one") or ("w", "i"))
    monkeypatch.setattr(moe_routing, "route_topk", lambda *a, **k: calls.append("two") or ("w", "i"))
    monkeypatch.setattr(moe_routing, "router_logits", lambda *a, **k: None)
    w = torch.randn(8, 16, device=DEVICE)
    for n in (1, 2, 5):
        moe_routing.fused_route(torch.randn(n, 16, device=DEVICE), w, 2, True, 1.0)
    assert calls == ["one", "two", "two"]


@pytest.mark.parametrize("num_tokens,top_k", [(1, 4), (3, 4)])
def test_direct_path_matches_the_aligned_path_and_sums_in_the_gemm(num_tokens, top_k):
    # Three tokens over eight experts share some: the direct path reads those once a pair.
    from cgtool.model.moe_triton import DIRECT_CONFIG
    from cgtool.runtime.tickets import tickets

    hidden, inter = 48, 40
    x = torch.randn(num_tokens, hidden, device=DEVICE)
    gate_up, down = _experts(8, hidden, inter, torch.float32)
    weights, ids = _routing(num_tokens, 8, top_k)
    direct = fused_experts(x, gate_up, down, weights, ids, DIRECT_CONFIG)
    aligned = fused_experts(x, gate_up, down, weights, ids, CONFIGS[0][1])
    # Within fp32 rounding, not bit for bit: the interpreter's tl.dot is numpy's BLAS, whose
    # order of summation depends on the operands' shapes and on the CPU (OpenBLAS picks its
    # kernel at run time; the two paths' tiles differ). On one machine in 2026-11 they differed
    # by 1.5e-7 where they had been equal on others.
    torch.testing.assert_close(direct, aligned, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(direct, experts_ref(x, gate_up, down, weights, ids), rtol=1e-5, atol=1e-5)
    assert tickets(DEVICE, 64).eq(0).all()


def test_one_token_takes_the_direct_path():
    from cgtool.model.moe_triton import DIRECT, DIRECT_TOKENS

    assert experts_config(8, 128, num_tokens=1).block_m == DIRECT
    assert experts_config(8 * (DIRECT_TOKENS + 1), 128, num_tokens=DIRECT_TOKENS + 1).block_m > 0


@pytest.mark.gpu
def test_router_logits_kernel_matches_the_fp32_linear_of_bf16_weights():
    x = torch.randn(300, 2048, device="cuda").to(torch.bfloat16)
    w = (torch.randn(128, 2048, device="cuda") * 2048**-0.5).to(torch.bfloat16)
    expected = torch.nn.functional.linear(x.float(), w.float())
    torch.testing.assert_close(router_logits(x, w), expected, rtol=1e-5, atol=1e-5)


def test_sparse_moe_on_the_kernels_matches_the_reference(tmp_path):
    from hf_oracle import make_hf_model

    from cgtool.specs.config import load_model_config

    make_hf_model("deepseek_v2", tmp_path)
    cfg = load_model_config(str(tmp_path))
    torch.manual_seed(0)
    ref = SparseMoE(cfg).to(DEVICE)
    fused = SparseMoE(cfg).to(DEVICE)
    fused.load_state_dict(ref.state_dict())
    use_moe_backend(fused, "triton")
    x = torch.randn(9, cfg.hidden_size, device=DEVICE)
    torch.testing.assert_close(fused(x), ref(x), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- kernel vs reference


@pytest.mark.parametrize("num_experts,top_k,num_tokens", CASES)
def test_fused_experts_match_the_reference(num_experts, top_k, num_tokens):
    # hidden 48 and 2 * 40 gate/up rows: partial K and N tiles of the 64-wide blocks.
    hidden, inter = 48, 40
    x = torch.randn(num_tokens, hidden, device=DEVICE)
    gate_up, down = _experts(num_experts, hidden, inter, torch.float32)
    weights, ids = _routing(num_tokens, num_experts, top_k)
    out = fused_experts(x, gate_up, down, weights, ids)
    torch.testing.assert_close(out, experts_ref(x, gate_up, down, weights, ids), rtol=1e-5, atol=1e-5)


def test_fused_experts_when_every_token_picks_the_same_experts():
    num_experts, hidden, inter, num_tokens = 8, 32, 16, 20
    x = torch.randn(num_tokens, hidden, device=DEVICE)
    gate_up, down = _experts(num_experts, hidden, inter, torch.float32)
    ids = torch.tensor([[5, 2]], device=DEVICE).expand(num_tokens, 2).contiguous()
    weights = torch.rand(num_tokens, 2, device=DEVICE)
    out = fused_experts(x, gate_up, down, weights, ids)
    torch.testing.assert_close(out, experts_ref(x, gate_up, down, weights, ids), rtol=1e-5, atol=1e-5)


def test_experts_module_takes_the_kernel_only_when_asked():
    torch.manual_seed(0)
    ref = Experts(6, 32, 16).to(DEVICE)
    fused = Experts(6, 32, 16, backend="triton").to(DEVICE)
    fused.load_state_dict(ref.state_dict())
    x = torch.randn(7, 32, device=DEVICE)
    weights, ids = _routing(7, 6, 2)
    assert ref.backend == "torch"
    torch.testing.assert_close(fused(x, weights, ids), ref(x, weights, ids), rtol=1e-5, atol=1e-5)


def test_unknown_moe_backend_is_refused_by_name():
    with pytest.raises(ValueError, match="'cutlass'"):
        Experts(4, 16, 8, backend="cutlass")


def test_fused_experts_trace_as_one_opaque_node():
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm

    compiled = torch.compile(fused_experts, backend=record, fullgraph=True)
    x = torch.randn(3, 32, device=DEVICE)
    gate_up, down = _experts(4, 32, 16, torch.float32)
    weights, ids = _routing(3, 4, 2)
    out = compiled(x, gate_up, down, weights, ids)
    torch.testing.assert_close(out, experts_ref(x, gate_up, down, weights, ids), rtol=1e-5, atol=1e-5)
    targets = [node.target for node in graphs[0].graph.nodes if node.op == "call_function"]
    assert targets == [torch.ops.cgtool.fused_experts]


# ---------------------------------------------------------------- GPU: bf16 and capture


@pytest.mark.gpu
@pytest.mark.parametrize("num_experts,top_k", [(64, 6), (128, 8)])
@pytest.mark.parametrize("num_tokens", [1, 7, 64, 256, 2048])
def test_fused_experts_match_the_reference_in_bf16_at_preset_shapes(num_experts, top_k, num_tokens):
    hidden, inter = 2048, 768  # qwen3-30b-a3b's hidden and expert widths
    x = torch.randn(num_tokens, hidden, device="cuda").to(torch.bfloat16)
    gate_up, down = _experts(num_experts, hidden, inter, torch.bfloat16, device="cuda")
    weights, ids = _routing(num_tokens, num_experts, top_k, device="cuda")
    out = fused_experts(x, gate_up, down, weights, ids)
    expected = experts_ref(x.float(), gate_up.float(), down.float(), weights, ids)
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)


def captured_for_new_routing(x, gate_up, down, weights, ids):
    """`fused_experts` captured as a CUDA graph (after one eager call, which compiles), then
    `weights` and `ids` overwritten in place with another routing: (graph, its output)."""
    fused_experts(x, gate_up, down, weights, ids)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_experts(x, gate_up, down, weights, ids)
    num_tokens, top_k = ids.shape
    new_weights, new_ids = _routing(num_tokens, gate_up.shape[0], top_k, seed=7, device="cuda")
    weights.copy_(new_weights)
    ids.copy_(new_ids)
    return graph, out


@pytest.mark.gpu
def test_fused_experts_replay_a_captured_graph_for_new_routing():
    num_experts, top_k, num_tokens, hidden, inter = 128, 8, 16, 256, 128
    x = torch.randn(num_tokens, hidden, device="cuda").to(torch.bfloat16)
    gate_up, down = _experts(num_experts, hidden, inter, torch.bfloat16, device="cuda")
    weights, ids = _routing(num_tokens, num_experts, top_k, device="cuda")
    graph, out = captured_for_new_routing(x, gate_up, down, weights, ids)
    graph.replay()
    torch.testing.assert_close(out, fused_experts(x, gate_up, down, weights, ids), rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("num_experts,top_k", [(64, 6), (128, 8)])
def test_direct_path_replays_equal_to_the_aligned_path_in_bf16(num_experts, top_k):
    # The top-k sum happens in whichever down program finishes last: 50 replays must all give
    # the aligned path's bits, or the tickets' ordering lost a row.
    hidden, inter = 2048, 768
    x = torch.randn(1, hidden, device="cuda").to(torch.bfloat16)
    gate_up, down = _experts(num_experts, hidden, inter, torch.bfloat16, device="cuda")
    weights, ids = _routing(1, num_experts, top_k, device="cuda")
    aligned = fused_experts(x, gate_up, down, weights, ids, CONFIGS[0][1])
    fused_experts(x, gate_up, down, weights, ids)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_experts(x, gate_up, down, weights, ids)
    for _ in range(50):
        out.zero_()
        graph.replay()
        torch.testing.assert_close(out, aligned, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("num_experts,top_k", [(64, 6), (128, 8)])
def test_router_and_routing_in_one_launch_replay_the_two_kernels_choice_in_bf16(num_experts, top_k):
    from cgtool.model.moe_routing import router_route

    x = torch.randn(1, 2048, device="cuda").to(torch.bfloat16)
    w = (torch.randn(num_experts, 2048, device="cuda") * 2048**-0.5).to(torch.bfloat16)
    ref_weights, ref_ids = route_topk(router_logits(x, w), top_k, True, 1.0)
    router_route(x, w, top_k, True, 1.0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        weights, ids = router_route(x, w, top_k, True, 1.0)
    for _ in range(50):
        ids.fill_(-1)
        graph.replay()
        assert torch.equal(ids, ref_ids)
        torch.testing.assert_close(weights, ref_weights, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("num_experts,top_k", [(64, 6), (128, 8)])
def test_one_tokens_dependent_launches_replay_equal_to_ordinary_ones(monkeypatch, num_experts, top_k):
    # Eight layers, each one's input the last one's output: a launch that ran ahead of the
    # kernel before it (router, gate/up, down, the next layer's router) would read stale rows.
    from cgtool.model.moe_routing import fused_route
    from cgtool.runtime import dependent_launch

    hidden, inter, layers = 2048, 768, 8
    routers = [(torch.randn(num_experts, hidden, device="cuda") * hidden**-0.5).to(torch.bfloat16)
               for _ in range(layers)]
    experts = [_experts(num_experts, hidden, inter, torch.bfloat16, seed=i, device="cuda") for i in range(layers)]
    x0 = torch.randn(1, hidden, device="cuda").to(torch.bfloat16)

    def forward(x):
        for router, (gate_up, down) in zip(routers, experts):
            x = x + fused_experts(x, gate_up, down, *fused_route(x, router, top_k, True, 1.0))
        return x

    monkeypatch.setattr(dependent_launch, "DEPENDENT_LAUNCH", False)
    ordinary = forward(x0)
    monkeypatch.setattr(dependent_launch, "DEPENDENT_LAUNCH", True)
    forward(x0)  # compile outside the capture
    x_in = x0.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = forward(x_in)
    for _ in range(20):
        out.zero_()
        graph.replay()
        torch.testing.assert_close(out, ordinary, rtol=0, atol=0)
