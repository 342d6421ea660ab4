"""DeepSeek's multi-head latent attention, in the absorbed form, over a latent KV pool.

Each token caches one latent of kv_lora_rank + qk_rope_head_dim values per layer: the
normalised compressed KV and the rotated shared key. Absorbing kv_b_proj's key half into the
query and its value half into the output makes attention a multi-query attention of one
latent head, keys the whole latent and values its first kv_lora_rank values, which is how
SGLang's MLA backends decode. The latent goes through cgtool's attention op as both K and V
(the pool stores it once); the op's output per head is kv_lora_rank wide: the attention over
the compressed KV. With the triton backend, cgtool.attention.triton_mla's kernels run it.
"""

from __future__ import annotations

import torch
from torch import nn

from cgtool.attention.op import attention, latent_attention
from cgtool.model.layers import RMSNorm, RotaryEmbedding
from cgtool.specs.config import ModelConfig


def pairs_to_halves(x: torch.Tensor) -> torch.Tensor:
    """DeepSeek rotates interleaved pairs (x0, x1), (x2, x3)...; cgtool's rope kernel rotates
    halves. Moving the pairs' members into halves, the same in q and k, keeps every q·k."""
    return x.unflatten(-1, (-1, 2)).transpose(-1, -2).flatten(-2)


class LatentAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        assert cfg.mla is not None
        self.mla = m = cfg.mla
        self.num_heads, self.layer_id, self.rotary = cfg.num_heads, layer_id, rotary
        h, heads = cfg.hidden_size, cfg.num_heads
        self.q_proj = nn.Linear(h, heads * (m.qk_nope_head_dim + m.qk_rope_head_dim), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(h, m.kv_lora_rank + m.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(m.kv_lora_rank, cfg.rms_norm_eps)
        self.kv_b_proj = nn.Linear(
            m.kv_lora_rank, heads * (m.qk_nope_head_dim + m.v_head_dim), bias=False
        )
        self.o_proj = nn.Linear(heads * m.v_head_dim, h, bias=False)
        # The backends scale scores by the latent head's head_dim ** -0.5; MLA's softmax scale
        # is that of the un-absorbed query-key head, so q carries the ratio.
        self.q_scale = (m.qk_nope_head_dim + m.qk_rope_head_dim) ** -0.5 / cfg.head_dim**-0.5

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        m, n, heads = self.mla, x.shape[0], self.num_heads
        q_nope, q_pe = self.q_proj(x).view(n, heads, -1).split(
            [m.qk_nope_head_dim, m.qk_rope_head_dim], dim=-1
        )
        compressed, k_pe = self.kv_a_proj_with_mqa(x).split([m.kv_lora_rank, m.qk_rope_head_dim], -1)
        # A strided view: the norm reads rows at any stride, so a copy would only add a kernel.
        compressed = self.kv_a_layernorm(compressed)
        q_pe, k_pe = self.rotary(positions, pairs_to_halves(q_pe), pairs_to_halves(k_pe.view(n, 1, -1)))
        # [heads, nope + v, kv_lora_rank]: each head's key and value up-projections
        w_uk, w_uv = self.kv_b_proj.weight.view(heads, -1, m.kv_lora_rank).split(
            [m.qk_nope_head_dim, m.v_head_dim], dim=1
        )
        q_latent = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)  # [n, heads, rank]
        q = torch.cat([q_latent, q_pe], dim=-1) * self.q_scale  # [n, heads, rank + rope]
        latent = torch.cat([compressed, k_pe.view(n, -1)], dim=-1)  # [n, rank + rope]
        out = q.new_empty(n, heads * m.kv_lora_rank)
        o = None if torch.compiler.is_compiling() else q.new_empty(n, heads * m.v_head_dim)
        if o is None:
            attention(q.view(n, -1), latent, latent, out, self.layer_id)
        elif latent_attention(q.view(n, -1), latent, out, w_uv, o, self.layer_id):
            return self.o_proj(o)  # the value projection ran with the attention's merge
        o_latent = out.view(n, heads, m.kv_lora_rank).transpose(0, 1)
        return self.o_proj(value_projection(o_latent, w_uv.transpose(1, 2), o))


def value_projection(o_latent: torch.Tensor, w_uv: torch.Tensor, o: torch.Tensor | None = None) -> torch.Tensor:
    """[tokens, heads * v] from the heads' latent outputs [heads, tokens, rank] and their value
    up-projections [heads, rank, v]. Eagerly the batched product writes each head's rows
    straight into the token-major layout o_proj reads (as SGLang's absorbed decode does), where
    a product and a transpose's copy took two kernels (a census of captured decode forwards,
    benchmarks/results/h200-h100-2026-11-27-mla-flat). Dynamo refuses an `out=` of that
    layout, so a compiled graph keeps the copy."""
    heads, n, v = o_latent.shape[0], o_latent.shape[1], w_uv.shape[-1]
    if torch.compiler.is_compiling():
        return torch.bmm(o_latent, w_uv).transpose(0, 1).reshape(n, heads * v)
    o = o_latent.new_empty(n, heads * v) if o is None else o
    torch.bmm(o_latent, w_uv, out=o.view(n, heads, v).transpose(0, 1))
    return o
