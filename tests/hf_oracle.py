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
SHAPES = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


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
    elif arch == "mistral":
        config = transformers.MistralConfig(**shapes, sliding_window=None)
        model = transformers.MistralForCausalLM(config)
    else:
        raise ValueError(arch)
    with torch.no_grad():  # HF's default init leaves biases and norms trivial: perturb them
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.eval()
    model.save_pretrained(folder, safe_serialization=True)
    return model


def hf_logits(model: torch.nn.Module, token_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0].float()
