"""The Llama-family decoder. Reads top-down: attention, block, model, LM head."""

from __future__ import annotations

import torch
from torch import nn

from cgtool.attention.op import attention, attention_over_stored, stores_with_rope
from cgtool.model.direct_call import DirectCall
from cgtool.model.fused import apply_rope_and_store, apply_rope_and_store_qkv
from cgtool.model.layers import RMSNorm, RotaryEmbedding, SwiGLU
from cgtool.model.mla import LatentAttention
from cgtool.model.moe import SparseMoE
from cgtool.model.parallel import (
    ColumnParallelLinear,
    ParallelLMHead,
    RowParallelLinear,
    VocabParallelEmbedding,
    kv_head_range,
    local_config,
    split,
)
from cgtool.runtime.batch import get_forward_context, scratch_empty
from cgtool.runtime.distributed import SINGLE, TensorParallel
from cgtool.specs.config import ModelConfig


class Attention(DirectCall, nn.Module):
    def __init__(
        self, cfg: ModelConfig, layer_id: int, rotary: RotaryEmbedding, tp: TensorParallel = SINGLE
    ) -> None:
        super().__init__()
        self.cfg = local_config(cfg, tp)  # this rank's heads
        self.layer_id = layer_id
        self.rotary = rotary
        (h0, h1), (k0, k1), d = split(cfg.num_heads, tp), kv_head_range(cfg, tp), cfg.head_dim
        q_rows, kv_rows = (h0 * d, h1 * d), (k0 * d, k1 * d)
        self.qkv_proj = ColumnParallelLinear(
            cfg.hidden_size, [cfg.q_size, cfg.kv_size, cfg.kv_size], cfg.qkv_bias, tp,
            [q_rows, kv_rows, kv_rows],
        )
        self.o_proj = RowParallelLinear(cfg.q_size, cfg.hidden_size, tp, q_rows)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        cfg, n = self.cfg, x.shape[0]
        qkv = self.qkv_proj(x)
        out = scratch_empty("attention_out", (n, cfg.q_size), qkv.dtype, qkv.device)
        if stores_with_rope(qkv):
            # One launch fewer a layer: ~30 µs of an eager step's host time, a kernel of a replay.
            ctx = get_forward_context()
            pool, layer, loc = ctx.kv_pool, self.layer_id, ctx.batch.out_cache_loc
            caches = pool.k_buffers[layer], pool.v_buffers[layer]
            if cfg.qk_norm:
                q, k, v = self._heads(qkv)
                q = apply_rope_and_store(q, k, v, positions, self.rotary.cos_sin, *caches, loc).view(n, cfg.q_size)
            else:
                q = apply_rope_and_store_qkv(
                    qkv, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, positions, self.rotary.cos_sin, *caches, loc
                )
            attention_over_stored(q, out, layer)
        else:
            q, k, v = self._heads(qkv)
            q, k = self.rotary(positions, q, k)
            attention(q.view(n, cfg.q_size), k.view(n, cfg.kv_size), v, out, self.layer_id)
        return self.o_proj(out)

    def _heads(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [n, heads, head_dim], k [n, kv_heads, head_dim] (normed where the model norms
        them) and v [n, kv_size]: strided views of the qkv output, which rope reads in place
        and the KV store reads where it lies."""
        cfg, n = self.cfg, qkv.shape[0]
        q, k, v = qkv.split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
        q = q.view(n, cfg.num_heads, cfg.head_dim)
        k = k.view(n, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v


class DecoderLayer(DirectCall, nn.Module):
    def __init__(
        self, cfg: ModelConfig, layer_id: int, rotary: RotaryEmbedding, tp: TensorParallel = SINGLE
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn: nn.Module = (
            LatentAttention(cfg, layer_id, rotary) if cfg.mla else Attention(cfg, layer_id, rotary, tp)
        )
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp: nn.Module = (
            SparseMoE(cfg) if cfg.is_moe_layer(layer_id) else SwiGLU(cfg.hidden_size, cfg.intermediate_size, tp)
        )

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream is carried apart from the hidden state, as in SGLang and vLLM,
        so that each residual add is fused into the norm that follows it."""
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class DecoderBody(nn.Module):
    """Embedding → layers → final norm: the part piecewise graphs capture."""

    def __init__(self, cfg: ModelConfig, max_positions: int, tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp)
        rotary = RotaryEmbedding(cfg, max_positions)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, rotary, tp) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        residual: torch.Tensor | None = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class CausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int, tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        self.cfg = cfg
        self.tp = tp
        self.model = DecoderBody(cfg, max_positions, tp)
        self.lm_head = ParallelLMHead(cfg.hidden_size, cfg.vocab_size, tp)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Hidden states of every token: [num_tokens, hidden]."""
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """fp32 logits; into `out` when given (one copy that also casts, not a cast and a copy)."""
        if out is None:
            return self.lm_head.logits(hidden).float()
        return out.copy_(self.lm_head.logits(hidden))
