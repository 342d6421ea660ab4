"""The memory a --mem-fraction-static leaves outside the KV pool, term by term, per model family.

Each term is a shape formula of what cgtool's kernels hold (so that verify's rehearsal and the
prediction describe the same process), and each was checked against the H100 80GB HBM3 on
2026-11-26 (benchmarks/results/h100-2026-11-26-memory/parts-call3.json; tests/test_memory_terms.py
reads it):

- eager activations, bytes a token keeps live at a forward's peak: the widest MLP (a dense
  SwiGLU, or cgtool's fused MoE: bf16 gate_up and activation, fp32 weighted outputs and their
  fp32 sum, the fp32 router) beside the hidden states and this layer's q, k and v;
- the piecewise graph pool: what the eager forward keeps, times what capturing the pieces
  keeps beyond it (each piece's inputs and outputs live across the split points);
- the decode graph pool: the split-KV partials of the decode kernel (fp32, heads x splits x
  (width + 1) a request) beside one token's activations, and the bf16 logits where they do not
  fit in the partials' freed block. The two runners capture on streams of
  their own, and the caching allocator does not hand a block freed on one stream to another:
  the decode pool adds to the piecewise pool (measured: +88 to +166 MiB at 256 requests);
- graph objects outside torch's allocator: about 8 KiB per kernel node.

The MoE and MLA terms describe the kernels as measured (before commit 7650258, which dropped the
fused MoE's gate_up buffer and fp32 top-k sum and cut MLA decode to 2-64 splits): they over-state
what today's kernels hold, so the fraction errs low until the terms are measured again
(docs/memory.md).
"""

from __future__ import annotations

from cgtool.planner.kernel_terms import MLA_HEADS_PER_PROGRAM
from cgtool.planner.parallel import rank_shapes
from cgtool.specs.config import ModelConfig
from cgtool.units import BF16_BYTES, FP32_BYTES

# Piecewise graph pool over the eager activation peak at the same token count, measured at
# 8,192 tokens (H100, 2026-11-26, parts-call3.json): llama-3.1-8b 1,264 / 992 MiB, qwen3-30b-a3b
# 1,458 / 869 MiB, deepseek-v2-lite 1,448 / 863 MiB. For dense models the cross-piece tensors
# (q, k, v, the attention output, hidden and residual) account for it; MoE pieces keep more.
GRAPH_POOL_OVER_EAGER = {"dense": 1.27, "MoE": 1.68, "MLA": 1.68}
# Graph objects: verify's default sets (94 graphs each, captured beside the plan's, so none
# could reuse freed graph memory) held 0.29, 0.50 and 0.41 GiB beyond their pools for 356, 772
# and 644 kernels a forward: 8.7, 7.2 and 7.0 KiB a node. Graphs captured after others were
# freed cost nothing new (the driver reuses them: parts-call3.json's second pass).
GRAPH_NODE_BYTES = 8 << 10
# cgtool.attention.triton_decode's room for partials (num_kv_splits_for, chunk_slots): about
# 1,024 programs, 16..64 chunks a request, and at least max(target_chunks, 15 bs) + bs a KV head;
# MLA used the first rule too when measured (triton_mla.mla_num_kv_splits now aims at 264
# programs, 1..64). The planner does not import the kernels (Triton), so the rule is repeated
# here and tests/test_memory_terms.py checks that the two agree.
_TARGET_PROGRAMS, _MIN_SPLITS, _MAX_SPLITS = 1024, 16, 64


def family(cfg: ModelConfig) -> str:
    if cfg.mla is not None:
        return "MLA"
    return "MoE" if cfg.moe is not None else "dense"


def activation_bytes_per_token(cfg: ModelConfig, tp_size: int = 1) -> int:
    """Bytes one token keeps live on one rank at an eager forward's peak (logits apart)."""
    shard = rank_shapes(cfg, tp_size)
    attention = (4 * cfg.hidden_size + shard.q_size + 2 * shard.kv_size) * BF16_BYTES
    dense = 3 * shard.intermediate_size * BF16_BYTES if cfg.num_moe_layers < cfg.num_layers else 0
    return max(attention + dense, _moe_bytes_per_token(cfg))


def _moe_bytes_per_token(cfg: ModelConfig) -> int:
    """cgtool.model.moe_triton at its peak: each routed pair's gate_up [2I] and activation [I]
    in bf16 and weighted output [hidden] in fp32, the fp32 sum over the top k, the fp32 router
    logits and probabilities, beside the layer's bf16 input and residual."""
    moe = cfg.moe
    if moe is None:
        return 0
    width, hidden = moe.expert_intermediate_size, cfg.hidden_size
    routed = moe.top_k * (3 * width * BF16_BYTES + hidden * FP32_BYTES)
    router = 2 * moe.num_experts * FP32_BYTES
    return routed + hidden * FP32_BYTES + router + 2 * hidden * BF16_BYTES


def extend_graph_pool_bytes(cfg: ModelConfig, num_tokens: float, tp_size: int = 1) -> float:
    """The shared pool the largest piecewise size takes (smaller sizes reuse it)."""
    per_token = activation_bytes_per_token(cfg, tp_size) * GRAPH_POOL_OVER_EAGER[family(cfg)]
    return num_tokens * per_token


def decode_kv_splits(cfg: ModelConfig, bs: int, tp_size: int = 1) -> int:
    shard = rank_shapes(cfg, tp_size)
    groups = -(-shard.num_heads // MLA_HEADS_PER_PROGRAM) if cfg.mla is not None else shard.num_kv_heads
    wanted = 1 << max(0, (-(-_TARGET_PROGRAMS // max(bs * groups, 1)) - 1).bit_length())
    return max(_MIN_SPLITS, min(_MAX_SPLITS, wanted))


def decode_chunk_slots(cfg: ModelConfig, bs: int, tp_size: int = 1) -> int:
    """Chunks of partial results a decode step of `bs` requests keeps room for, a head."""
    splits = bs * decode_kv_splits(cfg, bs, tp_size)
    if cfg.mla is not None:
        return splits
    kv_heads = rank_shapes(cfg, tp_size).num_kv_heads
    aimed = max(_MAX_SPLITS, _TARGET_PROGRAMS // kv_heads, (_MIN_SPLITS - 1) * bs)
    return max(splits, aimed + bs)


def decode_partials_bytes(cfg: ModelConfig, bs: int, tp_size: int = 1) -> int:
    """Per request (rounded up), the decode kernel's fp32 partial outputs and log-sum-exps of
    every chunk; an eager decode allocates them once for all layers, a captured one per layer
    (reused)."""
    shard = rank_shapes(cfg, tp_size)
    width = cfg.mla.kv_lora_rank if cfg.mla is not None else cfg.head_dim
    bs = max(bs, 1)
    return -(-shard.num_heads * decode_chunk_slots(cfg, bs, tp_size) * (width + 1) * FP32_BYTES // bs)


def decode_graph_pool_bytes(cfg: ModelConfig, bs: int, tp_size: int = 1) -> float:
    """The pool the largest decode graph adds: per request, the decode kernel's fp32 partial
    outputs and log-sum-exps of every split beside one token's activations; the bf16 logits,
    computed last, reuse the partials' freed block when they fit in it and add when they do
    not (qwen3-30b-a3b: 297 KB of logits a request against 264 KB of partials, +74 MiB at 256)."""
    if bs <= 0:
        return 0.0
    partials = decode_partials_bytes(cfg, bs, tp_size)
    logits = cfg.vocab_size * BF16_BYTES  # gathered whole on every rank
    row = partials + activation_bytes_per_token(cfg, tp_size) + (logits if logits > partials else 0)
    return float(bs * row)
