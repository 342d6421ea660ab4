import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hf_oracle import make_hf_model
from typer.testing import CliRunner

from cgtool.commands.main import app
from cgtool.model.loader import build_model
from cgtool.model.moe import (
    Experts,
    SparseMoE,
    count_active_experts,
    experts_ref,
    route,
    use_moe_backend,
)
from cgtool.specs.config import load_model_config
from cgtool.specs.config_parts import MoeConfig

EXAMPLE = Path(__file__).parent.parent / "examples" / "azure-conv-first-1000.jsonl"


def _moe(**changes):
    return MoeConfig(**({"num_experts": 8, "top_k": 3, "expert_intermediate_size": 16} | changes))


def test_route_picks_the_top_k_experts_by_softmax_score():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0, -1.0, 0.5, 0.0, 0.0]])
    weights, ids = route(logits, _moe())
    assert set(ids[0].tolist()) == {1, 3, 2}
    probs = logits.softmax(-1)[0]
    torch.testing.assert_close(weights[0], probs[ids[0]])


def test_route_renormalises_and_scales_as_configured():
    logits = torch.randn(5, 8, generator=torch.Generator().manual_seed(0))
    weights, _ = route(logits, _moe(norm_topk_prob=True, routed_scaling_factor=2.0))
    torch.testing.assert_close(weights.sum(-1), torch.full((5,), 2.0))


def test_experts_ref_equals_a_loop_over_each_tokens_experts():
    gen = torch.Generator().manual_seed(0)
    n, h, inter, num_experts = 6, 12, 10, 5
    x = torch.randn(n, h, generator=gen)
    gate_up = torch.randn(num_experts, 2 * inter, h, generator=gen)
    down = torch.randn(num_experts, h, inter, generator=gen)
    weights, ids = route(torch.randn(n, num_experts, generator=gen), _moe(num_experts=5, top_k=2))
    expected = torch.zeros(n, h)
    for t in range(n):
        for w, e in zip(weights[t], ids[t]):
            gate, up = (gate_up[e] @ x[t]).chunk(2)
            expected[t] += w * (down[e] @ (F.silu(gate) * up))
    torch.testing.assert_close(experts_ref(x, gate_up, down, weights, ids), expected)


@pytest.mark.parametrize("arch", ["qwen3_moe", "deepseek_v2"])
def test_parameter_count_matches_hf_and_the_built_model(tmp_path, arch):
    hf = make_hf_model(arch, tmp_path)
    cfg = load_model_config(str(tmp_path))
    model = build_model(cfg, device="cpu", dtype=torch.float32, max_positions=32)
    assert cfg.param_count() == sum(p.numel() for p in hf.parameters())
    assert cfg.param_count() == sum(p.numel() for p in model.parameters())


def test_unsupported_moe_variant_exits_2_naming_the_field(tmp_path):
    raw = json.loads((Path(__file__).parent.parent / "cgtool/presets/qwen3-30b-a3b.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(raw | {"decoder_sparse_step": 2}))
    result = CliRunner().invoke(app, ["plan", "--trace", str(EXAMPLE), "--model", str(tmp_path)])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2
    assert len(lines) == 1 and "'decoder_sparse_step'" in lines[0] and "Traceback" not in result.output


def _tiny_moe_model(arch, tmp_path):
    make_hf_model(arch, tmp_path)
    cfg = load_model_config(str(tmp_path))
    return cfg, build_model(cfg, device="cpu", dtype=torch.float32, max_positions=32)


def test_use_moe_backend_switches_every_experts_layer_and_refuses_unknown(tmp_path):
    _, model = _tiny_moe_model("qwen3_moe", tmp_path)
    experts = [m for m in model.modules() if isinstance(m, Experts)]
    assert experts and {e.backend for e in experts} == {"torch"}
    use_moe_backend(model, "triton")
    assert {e.backend for e in experts} == {"triton"}
    with pytest.raises(ValueError, match="'cuda'"):
        use_moe_backend(model, "cuda")


def test_count_active_experts_counts_each_layers_distinct_routed_experts(tmp_path):
    cfg, model = _tiny_moe_model("deepseek_v2", tmp_path)
    layers = [m for m in model.modules() if isinstance(m, SparseMoE)]
    x = torch.randn(7, cfg.hidden_size, generator=torch.Generator().manual_seed(2))
    # the ids route() picks for x, counted apart from the module
    routed = [route(F.linear(x, layer.gate.weight), layer.moe)[1].unique().numel() for layer in layers]
    tokens = torch.randint(0, cfg.vocab_size, (7,), generator=torch.Generator().manual_seed(1))
    with count_active_experts(model) as counts:
        model.model.embed_tokens(tokens)  # no MoE layer runs: nothing counted
        assert counts == []
        for layer in layers:
            layer(x)
    assert counts == routed and len(counts) == len(layers)
    assert all(cfg.moe.top_k <= c <= cfg.moe.num_experts for c in counts)
    layers[0](torch.randn(3, cfg.hidden_size))  # counting has stopped
    assert len(counts) == len(layers) and all(layer.active_counts is None for layer in layers)
