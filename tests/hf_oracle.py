"""Tiny HF transformers models saved to safetensors: the independent oracle for the forward pass."""

from __future__ import annotations

from pathlib import Path

import torch

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
SHAPES = {
    "vocab_size": 97,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}

# MLA and MoE of DeepSeek-V2-Lite's kind at toy size: a dense first layer, shared experts,
# un-normalised top-k weights (scaled, to check the factor is applied).
DEEPSEEK_V2 = {
    "kv_lora_rank": 32, "q_lora_rank": None, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
    "v_head_dim": 16, "n_routed_experts": 8, "n_shared_experts": 2, "num_experts_per_tok": 3,
    "moe_intermediate_size": 32, "first_k_dense_replace": 1, "norm_topk_prob": False,
    "routed_scaling_factor": 1.5,
}


def make_hf_model(arch: str, folder: Path, seed: int = 0, **overrides: int) -> torch.nn.Module:
    """`overrides` change SHAPES, e.g. num_key_value_heads=1."""
    import transformers

    torch.manual_seed(seed)
    shapes = SHAPES | overrides
    if arch == "llama":
        config = transformers.LlamaConfig(**shapes, rope_scaling=LLAMA3_ROPE, rope_theta=10000.0)
        model = transformers.LlamaForCausalLM(config)
    elif arch == "qwen2":
        config = transformers.Qwen2Config(**shapes, tie_word_embeddings=True)
        model = transformers.Qwen2ForCausalLM(config)
    elif arch == "qwen3":
        config = transformers.Qwen3Config(**shapes, head_dim=32)
        model = transformers.Qwen3ForCausalLM(config)
    elif arch == "qwen3_moe":
        config = transformers.Qwen3MoeConfig(
            **shapes, head_dim=32, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
            norm_topk_prob=True,
        )
        model = transformers.Qwen3MoeForCausalLM(config)
    elif arch == "deepseek_v2":
        config = transformers.DeepseekV2Config(**DEEPSEEK_V2 | shapes | {"num_key_value_heads": shapes["num_attention_heads"]})
        model = transformers.DeepseekV2ForCausalLM(config)
    elif arch == "mistral":
        config = transformers.MistralConfig(**shapes, sliding_window=None)
        model = transformers.MistralForCausalLM(config)
    else:
        raise ValueError(arch)
    with torch.no_grad():  # HF's default init leaves biases and norms trivial: perturb them
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
            elif name.endswith("mlp.gate.weight"):  # routers: clear winners, no near-ties
                p.normal_()
    model.eval()
    model.save_pretrained(folder, safe_serialization=True)
    return model


def hf_logits(model: torch.nn.Module, token_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0].float()
