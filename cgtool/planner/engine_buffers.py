"""Buffers SGLang allocates for its decode graphs outside the graph pool, at `max_bs`.

SGLang 0.5.4's CudaGraphRunner.__init__ (model_executor/cuda_graph_runner.py) first calls the
attention backend's `init_cuda_graph_state(max_bs, max_num_token)`, then allocates the graphs'
static inputs and the fp32 next-token logits buffer. Both live for the server's lifetime and
come out of the memory `--mem-fraction-static` leaves free, like the graphs themselves.
`max_bs` is the largest captured batch size and `max_num_token = max_bs` for plain decode
(one token a request, no speculative decoding); `context_len` is the model's context length,
which sizes the per-request index tables of every backend. Formulas cover a plain decoder
without speculative decoding, sliding-window or local attention, with SGLang's default page
size of 1; each names its source. Figures are one GPU's (heads split by `tp_size`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from cgtool.config import ModelConfig
from cgtool.errors import InputError
from cgtool.gpus import GpuSpec
from cgtool.planner.cost import CostModel
from cgtool.units import FP32_BYTES, INT32_BYTES, INT64_BYTES, UINT8_BYTES

SOURCE_VERSION = "sglang 0.5.4"
ATTENTION_BACKENDS = ("flashinfer", "fa3", "triton")
_HOPPER = ("H100-80GB", "H100-PCIe", "H200")
_BLACKWELL = ("B200",)
# utils/common.py is_fa3_default_architecture (sglang 0.5.4): MHA models that get FA3 on Hopper.
_FA3_DEFAULT_ARCHITECTURES = frozenset({
    "Qwen2ForCausalLM", "Llama4ForConditionalGeneration", "LlamaForCausalLM", "Olmo2ForCausalLM",
    "Gemma2ForCausalLM", "Gemma3ForConditionalGeneration", "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM", "Glm4MoeForCausalLM", "Glm4vMoeForConditionalGeneration",
    "Step3VLForConditionalGeneration",
})
# server_args.py ServerArgs.triton_attention_num_kv_splits default (sglang 0.5.4).
TRITON_MAX_KV_SPLITS = 8
PAGE_SIZE = 1  # server_args.py _handle_page_size: page_size None -> 1 (sglang 0.5.4)


@dataclass(frozen=True, slots=True)
class EngineGraphBuffers:
    attention_backend: str
    attention_bytes: int  # the backend's init_cuda_graph_state
    static_input_bytes: int  # CudaGraphRunner's inputs and its next-token logits buffer

    @property
    def total_bytes(self) -> int:
        return self.attention_bytes + self.static_input_bytes


def default_attention_backend(cfg: ModelConfig, gpu: GpuSpec) -> str:
    """The backend SGLang picks without --attention-backend: model_executor/model_runner.py
    ModelRunner.model_specific_adjustment (sglang 0.5.4), on CUDA, without speculative
    decoding. FlashInfer is assumed installed (it ships with SGLang's CUDA wheels)."""
    hopper = gpu.name in _HOPPER
    if cfg.mla is None:
        return "fa3" if hopper and cfg.architecture in _FA3_DEFAULT_ARCHITECTURES else "flashinfer"
    if hopper:
        return "fa3"
    return "flashinfer" if gpu.name in _BLACKWELL else "triton"


def check_attention_backend(name: str | None, engine: str) -> None:
    if name is None:
        return
    if name not in ATTENTION_BACKENDS:
        raise InputError(
            f"--attention-backend {name!r} is not one cgtool models",
            f"Use one of: {', '.join(ATTENTION_BACKENDS)}.",
        )
    if engine != "sglang":
        raise InputError(
            f"--attention-backend {name} names an SGLang backend, but --engine is {engine}",
            "Drop --attention-backend, or plan for --engine sglang.",
        )


def engine_graph_buffers(
    cfg: ModelConfig, backend: str, max_bs: int, context_len: int, tp_size: int = 1
) -> EngineGraphBuffers:
    """Bytes of SGLang's graph-time buffers for decode graphs up to `max_bs` (0 when none)."""
    if max_bs <= 0:
        return EngineGraphBuffers(backend, 0, 0)
    attention = _ATTENTION_BYTES[backend](cfg, max_bs, context_len, tp_size)
    return EngineGraphBuffers(backend, attention, static_input_bytes(cfg, max_bs))


def with_engine_buffers(
    cost: CostModel, cfg: ModelConfig, backend: str, context_len: int, tp_size: int = 1
) -> CostModel:
    """The cost model whose graph memory counts the engine's buffers at the largest decode
    size. Every formula is linear in max_bs, so two evaluations give its slope and constant."""
    one, two = (engine_graph_buffers(cfg, backend, bs, context_len, tp_size).total_bytes
                for bs in (1, 2))
    return replace(cost, decode_static_row_bytes=float(two - one),
                   decode_static_bytes=float(2 * one - two))


def static_input_bytes(cfg: ModelConfig, max_bs: int) -> int:
    """model_executor/cuda_graph_runner.py CudaGraphRunner.__init__ (sglang 0.5.4), max_num_token
    = max_bs: input_ids, out_cache_loc, positions int64 [T]; mrope_positions int64 [3, T];
    req_pool_indices, seq_lens int32 [B]; num_token_non_padded int32 [1]; custom_mask bool
    [seq_lens.sum() + T] with seq_lens at its fill value 1, so [2B]; next_token_logits_buffer
    fp32 [T, vocab]."""
    tokens = max_bs
    ints = (3 + 3) * tokens * INT64_BYTES + 2 * max_bs * INT32_BYTES + INT32_BYTES
    mask = (max_bs + tokens) * UINT8_BYTES
    return ints + mask + tokens * cfg.vocab_size * FP32_BYTES


def _flashinfer_bytes(cfg: ModelConfig, max_bs: int, context_len: int, tp_size: int) -> int:
    """layers/attention/flashinfer_backend.py FlashInferAttnBackend.init_cuda_graph_state
    (sglang 0.5.4): kv_indices int32 [max_num_tokens * context_len], custom_mask uint8
    [max_num_tokens * context_len], qk_indptr and qo_indptr int32 [max_bs + 1].
    MLA models run flashinfer_mla_backend.py FlashInferMLAAttnBackend.init_cuda_graph_state:
    kv_indices int32 [max_bs * context_len], qo_indptr and kv_indptr int32 [max_bs + 1],
    kv_lens int32 [max_bs], and no mask."""
    del tp_size  # index tables are per request, not per head
    indices = max_bs * context_len * INT32_BYTES
    if cfg.mla is not None:
        return indices + (2 * (max_bs + 1) + max_bs) * INT32_BYTES
    return indices + max_bs * context_len * UINT8_BYTES + 2 * (max_bs + 1) * INT32_BYTES


def _fa3_bytes(cfg: ModelConfig, max_bs: int, context_len: int, tp_size: int) -> int:
    """layers/attention/flashattention_backend.py FlashAttentionBackend.init_cuda_graph_state
    (sglang 0.5.4), MHA and MLA alike: cache_seqlens int32 [max_bs], cu_seqlens_q and
    cu_seqlens_k int32 [max_bs + 1], page_table int32 [max_bs, ceil(context_len / page_size)],
    strided_indices int64 [ceil(context_len / page_size)]."""
    del cfg, tp_size
    pages = -(-context_len // PAGE_SIZE)
    return (max_bs + 2 * (max_bs + 1) + max_bs * pages) * INT32_BYTES + pages * INT64_BYTES


def _triton_bytes(cfg: ModelConfig, max_bs: int, context_len: int, tp_size: int) -> int:
    """layers/attention/triton_backend.py TritonAttnBackend.init_cuda_graph_state (sglang
    0.5.4), T = max_num_tokens: attn_logits fp32 [T, heads, max_kv_splits, v_head_dim],
    attn_lse fp32 [T, heads, max_kv_splits], num_kv_splits int32 [T], kv_indices int64
    [T * context_len], custom_mask uint8 [T * context_len]. v_head_dim is the value buffer's
    width: the latent's kv_lora_rank for MLA."""
    heads = cfg.num_heads // tp_size
    v_head_dim = cfg.mla.kv_lora_rank if cfg.mla is not None else cfg.head_dim
    partials = max_bs * heads * TRITON_MAX_KV_SPLITS * (v_head_dim + 1) * FP32_BYTES
    return partials + max_bs * INT32_BYTES + max_bs * context_len * (INT64_BYTES + UINT8_BYTES)


_ATTENTION_BYTES = {"flashinfer": _flashinfer_bytes, "fa3": _fa3_bytes, "triton": _triton_bytes}
