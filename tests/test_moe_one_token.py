"""One token's MoE layer in one launch against the three launches it replaces and the reference.

On the CPU Triton's interpreter runs the programs in id order (fp32 shapes); the gpu-marked
tests run the real waits in bf16 at both presets' shapes and replay a captured graph.
"""

from __future__ import annotations

import pytest
import torch

from cgtool.model.moe import SparseMoE, experts_ref, route, use_moe_backend
from cgtool.model.moe_one_token import (
    ONE_TOKEN_TILES,
    OneTokenTiles,
    one_token_moe,
    one_token_moe_launch,
)
from cgtool.model.moe_routing import router_route
from cgtool.model.moe_triton import DIRECT_CONFIG, fused_experts
from cgtool.runtime.tickets import tickets

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# The direct path's tiles: the one launch then sums in the three launches' order, bit for bit.
SAME_TILES = OneTokenTiles(DIRECT_CONFIG.up.block_n, DIRECT_CONFIG.up.block_k, DIRECT_CONFIG.down.block_n,
                           DIRECT_CONFIG.down.block_k, DIRECT_CONFIG.up.num_warps, DIRECT_CONFIG.up.num_stages)


def _layer(num_experts, hidden, inter, dtype, seed=0, device=DEVICE):
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(1, hidden, generator=gen, device=device)
    router = torch.randn(num_experts, hidden, generator=gen, device=device) * hidden**-0.5
    gate_up = torch.randn(num_experts, 2 * inter, hidden, generator=gen, device=device) * hidden**-0.5
    down = torch.randn(num_experts, hidden, inter, generator=gen, device=device) * inter**-0.5
    return [t.to(dtype) for t in (x, router, gate_up, down)]


def _three_launches(x, router, gate_up, down, top_k, renormalise, scale):
    weights, ids = router_route(x, router, top_k, renormalise, scale)
    return fused_experts(x, gate_up, down, weights, ids, DIRECT_CONFIG), weights, ids


# (experts, top_k, hidden, expert width): the width not a multiple of the K tile, the hidden
# size not a multiple of the column tiles, top_k equal to the expert count.
CPU_CASES = [(8, 2, 48, 40), (64, 6, 96, 80), (16, 4, 300, 70), (6, 6, 32, 16)]


@pytest.mark.parametrize("num_experts,top_k,hidden,inter", CPU_CASES)
@pytest.mark.parametrize("renormalise,scale", [(True, 1.0), (False, 2.5)])
def test_one_launch_matches_the_three_launches_bit_for_bit(num_experts, top_k, hidden, inter, renormalise, scale):
    x, router, gate_up, down = _layer(num_experts, hidden, inter, torch.float32)
    out, weights, ids = one_token_moe_launch(x, router, gate_up, down, top_k, renormalise, scale, SAME_TILES)
    three, ref_weights, ref_ids = _three_launches(x, router, gate_up, down, top_k, renormalise, scale)
    assert torch.equal(ids, ref_ids) and torch.equal(weights, ref_weights)
    assert torch.equal(out, three)
    torch.testing.assert_close(out, experts_ref(x, gate_up, down, weights, ids.long()), rtol=1e-5, atol=1e-5)
    assert tickets(DEVICE, 256).eq(0).all(), "the launch left a counter off zero"


@pytest.mark.parametrize("tiles", [ONE_TOKEN_TILES, OneTokenTiles(16, 32, 16, 32, 4, 2)])
def test_one_launch_matches_the_reference_at_other_tiles(tiles):
    x, router, gate_up, down = _layer(64, 200, 72, torch.float32, seed=3)
    out, _, ids = one_token_moe_launch(x, router, gate_up, down, 6, True, 1.0, tiles)
    ref_weights, ref_ids = route(torch.nn.functional.linear(x, router), _moe(64, 6, True, 1.0))
    assert torch.equal(ids.long(), ref_ids)
    torch.testing.assert_close(out, experts_ref(x, gate_up, down, ref_weights, ref_ids), rtol=1e-5, atol=1e-5)


def _moe(num_experts, top_k, renormalise, scale):
    from cgtool.specs.config_parts import MoeConfig

    return MoeConfig(num_experts=num_experts, top_k=top_k, expert_intermediate_size=8,
                     norm_topk_prob=renormalise, routed_scaling_factor=scale)


def test_sparse_moe_takes_one_launch_for_one_token_only(tmp_path, monkeypatch):
    from hf_oracle import make_hf_model

    from cgtool.model import moe as moe_module
    from cgtool.specs.config import load_model_config

    make_hf_model("deepseek_v2", tmp_path)
    cfg = load_model_config(str(tmp_path))
    torch.manual_seed(0)
    ref = SparseMoE(cfg).to(DEVICE)
    fused = SparseMoE(cfg).to(DEVICE)
    fused.load_state_dict(ref.state_dict())
    use_moe_backend(fused, "triton")
    calls = []
    monkeypatch.setattr(moe_module, "one_token_moe", lambda *a: calls.append(1) or one_token_moe(*a))
    for n in (1, 3):
        x = torch.randn(n, cfg.hidden_size, device=DEVICE)
        torch.testing.assert_close(fused(x), ref(x), rtol=1e-5, atol=1e-5)
    assert calls == [1]


def test_one_launch_traces_as_one_opaque_node():
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm

    x, router, gate_up, down = _layer(8, 32, 16, torch.float32)
    compiled = torch.compile(one_token_moe, backend=record, fullgraph=True)
    out, ids = compiled(x, router, gate_up, down, 2, True, 1.0)
    expected, _, ref_ids = _three_launches(x, router, gate_up, down, 2, True, 1.0)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    import operator

    targets = [node.target for node in graphs[0].graph.nodes
               if node.op == "call_function" and node.target is not operator.getitem]
    assert targets == [torch.ops.cgtool.one_token_moe]


# ---------------------------------------------------------------- GPU: bf16, the real waits


@pytest.mark.gpu
@pytest.mark.parametrize("num_experts,top_k,inter", [(64, 6, 1408), (128, 8, 768)])
def test_one_launch_replays_the_three_launches_bits_in_bf16(num_experts, top_k, inter):
    # Programs really wait for each other here: 50 replays of a captured graph must all give
    # the three launches' bits, and the default tiles the reference's values.
    x, router, gate_up, down = _layer(num_experts, 2048, inter, torch.bfloat16, device="cuda")
    three, weights, ids = _three_launches(x, router, gate_up, down, top_k, True, 1.0)
    one_token_moe_launch(x, router, gate_up, down, top_k, True, 1.0, SAME_TILES)  # compile outside
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, _, got_ids = one_token_moe_launch(x, router, gate_up, down, top_k, True, 1.0, SAME_TILES)
    for _ in range(50):
        out.zero_()
        got_ids.fill_(-1)
        graph.replay()
        assert torch.equal(got_ids, ids)
        torch.testing.assert_close(out, three, rtol=0, atol=0)
    default = one_token_moe_launch(x, router, gate_up, down, top_k, True, 1.0)[0].float()
    ref = experts_ref(x.float(), gate_up.float(), down.float(), weights, ids.long())
    torch.testing.assert_close(default, ref, rtol=2e-2, atol=2e-3)
    assert tickets("cuda", 256).eq(0).all()
