"""Buffers SGLang allocates for its decode graphs outside the graph pool, at `max_bs`.

SGLang's decode graph runner (0.5.4 and 0.5.10: model_executor/cuda_graph_runner.py
CudaGraphRunner.__init__; 0.5.23: model_executor/runner/decode_cuda_graph_runner.py) first calls
the attention backend's `init_cuda_graph_state(max_bs, max_num_token)`, then allocates the
graphs' static inputs and the fp32 next-token logits buffer. Both live for the server's lifetime
and come out of the memory `--mem-fraction-static` leaves free, like the graphs themselves.
`max_bs` is the largest captured batch size and `max_num_token = max_bs` for plain decode (one
token a request, no speculative decoding); `context_len` is the model's context length, which
sizes the per-request index tables of every backend. Formulas cover a plain decoder without
speculative decoding, sliding-window or local attention, expert or data parallelism, with
SGLang's default page size of 1 on CUDA; figures are one GPU's (heads split by `tp_size`).

Read in the released wheels of SGLang 0.5.4, 0.5.10 and 0.5.23 (CHECKED_VERSIONS); what differs
between them is decided once, in _RELEASES, each field naming its file and function. No source
of the 0.5.3.dev development state cgtool also knows was found, so for it SGLang's default
backend is not modelled (no buffers are counted) and `--attention-backend` is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from cgtool.errors import InputError
from cgtool.planner.cost import CostModel
from cgtool.planner.schedules import resolve_version
from cgtool.specs.config import ModelConfig
from cgtool.specs.gpus import GpuSpec
from cgtool.units import BF16_BYTES, FP32_BYTES, INT32_BYTES, INT64_BYTES, UINT8_BYTES

ATTENTION_BACKENDS = ("flashinfer", "fa3", "triton")
CHECKED_VERSIONS = ("0.5.4", "0.5.10", "0.5.23")
_HOPPER = ("H100-80GB", "H100-PCIe", "H200")  # sm90: is_hopper_with_cuda_12_3
_BLACKWELL = ("B200",)  # sm100: is_sm100_supported
# utils/common.py is_fa3_default_architecture (0.5.4): MHA models that get FA3 on Hopper.
_FA3_DEFAULT_ARCHITECTURES = frozenset({
    "Qwen2ForCausalLM", "Llama4ForConditionalGeneration", "LlamaForCausalLM", "Olmo2ForCausalLM",
    "Gemma2ForCausalLM", "Gemma3ForConditionalGeneration", "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM", "Glm4MoeForCausalLM", "Glm4vMoeForConditionalGeneration",
    "Step3VLForConditionalGeneration",
})
# server_args triton_attention_num_kv_splits default: 8 in 0.5.4, 0.5.10 (server_args.py) and
# 0.5.23 (arg_groups/fields/exec_.py); page_size None -> 1 on CUDA in all three (0.5.4/0.5.10
# server_args.py _handle_page_size, 0.5.23 arg_groups/overrides.py _page_size_default).
TRITON_MAX_KV_SPLITS = 8
PAGE_SIZE = 1
_LEAN_BLOCK_M = 16  # 0.5.23 kernels/ops/attention/decode_attention.py _LEAN_BLOCK_M
_MLA_DECODE_MIN_BLOCK_KV = 32  # 0.5.23 triton_backend.py _MLA_DECODE_MIN_BLOCK_KV


@dataclass(frozen=True, slots=True)
class _Release:
    """What one SGLang release does differently, among the things this module counts."""

    # Default backend (0.5.4 model_runner.py ModelRunner.model_specific_adjustment; 0.5.10
    # server_args.py _get_default_attn_backend; 0.5.23 arg_groups/model_override_base.py
    # get_default_attn_backend). None: every MHA model gets FA3 on Hopper.
    fa3_mha_architectures: frozenset[str] | None
    mha_blackwell_trtllm: bool  # MHA on sm100 gets trtllm_mha, which cgtool does not model
    # FlashAttentionBackend.init_cuda_graph_state: 0.5.4 allocates encoder_metadata (a
    # [max_bs, context_len] int32 page table) for every model, later only encoder-decoders.
    fa3_encoder_table: bool
    fa3_scheduler_metadata: bool  # 0.5.23: _sched_meta_buf for MHA (fa_impl_ver 3)
    # TritonAttnBackend.init_cuda_graph_state: 0.5.23 drops the custom mask (only a verify
    # mask under speculative decoding), adds the lean-decode partials and an uneven-batch flag,
    # and __init__ raises MLA's kv splits toward the SM count (_mla_decode_kv_splits_cap).
    triton_custom_mask: bool
    triton_lean_and_mla_splits: bool
    # DecodeInputBuffers.create (0.5.10 cuda_graph_runner.py, 0.5.23 runner_utils/buffers.py):
    # input_embeds [T, hidden] in the model dtype, req_pool_indices int64, the two
    # global_num_tokens int32 [1] always; 0.5.23 seq_lens int64 and num_token_non_padded only
    # under expert parallelism (forward_batch_info.py enable_num_token_non_padded).
    input_embeds: bool
    seq_lens_int64: bool
    num_token_non_padded: bool


_RELEASES = {
    "0.5.4": _Release(
        fa3_mha_architectures=_FA3_DEFAULT_ARCHITECTURES, mha_blackwell_trtllm=False,
        fa3_encoder_table=True, fa3_scheduler_metadata=False, triton_custom_mask=True,
        triton_lean_and_mla_splits=False, input_embeds=False, seq_lens_int64=False,
        num_token_non_padded=True,
    ),
    "0.5.10": _Release(
        fa3_mha_architectures=None, mha_blackwell_trtllm=True,
        fa3_encoder_table=False, fa3_scheduler_metadata=False, triton_custom_mask=True,
        triton_lean_and_mla_splits=False, input_embeds=True, seq_lens_int64=False,
        num_token_non_padded=True,
    ),
    "0.5.23": _Release(
        fa3_mha_architectures=None, mha_blackwell_trtllm=True,
        fa3_encoder_table=False, fa3_scheduler_metadata=True, triton_custom_mask=False,
        triton_lean_and_mla_splits=True, input_embeds=True, seq_lens_int64=True,
        num_token_non_padded=False,
    ),
}


@dataclass(frozen=True, slots=True)
class EngineGraphBuffers:
    attention_backend: str
    attention_bytes: int  # the backend's init_cuda_graph_state
    static_input_bytes: int  # the graph runner's inputs and its next-token logits buffer

    @property
    def total_bytes(self) -> int:
        return self.attention_bytes + self.static_input_bytes


def default_attention_backend(cfg: ModelConfig, gpu: GpuSpec, version: str | None) -> str | None:
    """The backend SGLang `version` picks without --attention-backend, on CUDA, without
    speculative decoding (FlashInfer assumed installed: it ships with SGLang's CUDA wheels).
    None when that backend is not one cgtool models, or the release was not checked."""
    release = _RELEASES.get(resolve_version("sglang", version))
    if release is None:
        return None
    hopper = gpu.name in _HOPPER
    if cfg.mla is not None:
        return "fa3" if hopper else "flashinfer" if gpu.name in _BLACKWELL else "triton"
    archs = release.fa3_mha_architectures
    if hopper and (archs is None or cfg.architecture in archs):
        return "fa3"
    if gpu.name in _BLACKWELL and release.mha_blackwell_trtllm:
        return None
    return "flashinfer"


def check_attention_backend(name: str | None, engine: str, version: str | None = None) -> None:
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
    resolved = resolve_version(engine, version)
    if resolved not in _RELEASES:
        raise InputError(
            f"--attention-backend: SGLang {resolved}'s graph buffers were not checked "
            "(--engine-version)",
            f"Use --engine-version {', '.join(CHECKED_VERSIONS)}, or drop --attention-backend.",
        )


def engine_graph_buffers(
    cfg: ModelConfig, backend: str, max_bs: int, context_len: int, gpu: GpuSpec,
    version: str | None = None, tp_size: int = 1,
) -> EngineGraphBuffers:
    """Bytes of SGLang's graph-time buffers for decode graphs up to `max_bs` (0 when none)."""
    if max_bs <= 0:
        return EngineGraphBuffers(backend, 0, 0)
    release = _RELEASES[resolve_version("sglang", version)]
    shape = _Shape(cfg, max_bs, context_len, gpu, tp_size)
    attention = _ATTENTION_BYTES[backend](shape, release)
    return EngineGraphBuffers(backend, attention, _static_input_bytes(cfg, max_bs, release))


def with_engine_buffers(
    cost: CostModel, cfg: ModelConfig, backend: str, context_len: int, gpu: GpuSpec,
    version: str | None = None, tp_size: int = 1,
) -> CostModel:
    """The cost model whose graph memory counts the engine's buffers at the largest decode
    size. Every formula is linear in max_bs but for 0.5.23 FA3's scheduler metadata, which
    rounds max_bs up to 4 (16 bytes a step); evaluating at 4 and 8 keeps it exact at multiples
    of 4 and within 48 bytes elsewhere."""
    four, eight = (
        engine_graph_buffers(cfg, backend, bs, context_len, gpu, version, tp_size).total_bytes
        for bs in (4, 8)
    )
    row = (eight - four) / 4
    return replace(cost, decode_static_row_bytes=row, decode_static_bytes=float(four - 4 * row))


def _static_input_bytes(cfg: ModelConfig, max_bs: int, release: _Release) -> int:
    """The decode runner's static inputs, T = max_num_token = max_bs: input_ids, out_cache_loc,
    positions int64 [T]; mrope_positions int64 [3, T]; custom_mask bool [seq_lens at their fill
    value 1, summed, + T] = [2B]; seq_lens [B] (int32, 0.5.23 int64); num_token_non_padded
    int32 [1] (0.5.23: only under EP); req_pool_indices [B] int32 in 0.5.4, then int64 beside
    input_embeds and the two global_num_tokens (see _Release); next_token_logits_buffer fp32
    [T, vocab] (0.5.23: graph_shared_output.py GraphSharedOutput.get_logits_buffer, whose rows
    are max_decode_logits_rows = max_bs without speculative decoding)."""
    tokens = max_bs
    total = (3 + 3) * tokens * INT64_BYTES + (max_bs + tokens) * UINT8_BYTES
    total += tokens * cfg.vocab_size * FP32_BYTES
    total += INT32_BYTES if release.num_token_non_padded else 0
    total += max_bs * (INT64_BYTES if release.seq_lens_int64 else INT32_BYTES)
    if not release.input_embeds:
        return total + max_bs * INT32_BYTES  # req_pool_indices int32
    embeds = tokens * cfg.hidden_size * BF16_BYTES
    gathered = 2 * INT32_BYTES  # global_num_tokens_gpu, global_num_tokens_for_logprob_gpu
    return total + embeds + max_bs * INT64_BYTES + gathered


@dataclass(frozen=True, slots=True)
class _Shape:
    cfg: ModelConfig
    max_bs: int
    context_len: int
    gpu: GpuSpec
    tp_size: int


def _flashinfer_bytes(s: _Shape, release: _Release) -> int:
    """layers/attention/flashinfer_backend.py FlashInferAttnBackend.init_cuda_graph_state (same
    in all three): kv_indices int32 [max_num_tokens * context_len], custom_mask uint8
    [max_num_tokens * context_len], qk_indptr and qo_indptr int32 clones of kv_indptr.
    MLA models run flashinfer_mla_backend.py FlashInferMLAAttnBackend.init_cuda_graph_state
    (same in all three): kv_indices int32 [max_bs * context_len], qo_indptr and kv_indptr
    int32 clones, kv_lens int32 [max_bs], and no mask. The indptr clones are sized by the
    request pool in __init__ (req_to_token_pool.size + 1), not max_bs; they are counted at
    [max_bs + 1], a few KiB off at most."""
    del release  # unchanged across the checked releases
    bs, context = s.max_bs, s.context_len
    indices = bs * context * INT32_BYTES
    if s.cfg.mla is not None:
        return indices + (2 * (bs + 1) + bs) * INT32_BYTES
    return indices + bs * context * UINT8_BYTES + 2 * (bs + 1) * INT32_BYTES


def _fa3_bytes(s: _Shape, release: _Release) -> int:
    """layers/attention/flashattention_backend.py FlashAttentionBackend.init_cuda_graph_state,
    MHA and MLA alike: cache_seqlens int32 [max_bs], cu_seqlens_q and cu_seqlens_k int32
    [max_bs + 1], page_table int32 [max_bs, ceil(context_len / page_size)], strided_indices
    int64 [ceil(context_len / page_size)]. 0.5.4 adds encoder_metadata for every model:
    encoder_page_table int32 [max_bs, context_len], encoder_lens_int32 int32 [max_bs],
    encoder_cu_seqlens_k int32 [max_bs + 1]. 0.5.23 adds, for MHA, _sched_meta_buf int32
    [1 + round_up(max_bs, 4) * 4]."""
    bs, context = s.max_bs, s.context_len
    pages = -(-context // PAGE_SIZE)
    total = (bs + 2 * (bs + 1) + bs * pages) * INT32_BYTES + pages * INT64_BYTES
    if release.fa3_encoder_table:
        total += (bs * context + bs + bs + 1) * INT32_BYTES
    if release.fa3_scheduler_metadata and s.cfg.mla is None:
        total += (1 + -(-bs // 4) * 4 * 4) * INT32_BYTES
    return total


def _triton_bytes(s: _Shape, release: _Release) -> int:
    """layers/attention/triton_backend.py TritonAttnBackend.init_cuda_graph_state, T =
    max_num_tokens: attn_logits fp32 [T, heads, max_kv_splits, v_head_dim], attn_lse fp32
    [T, heads, max_kv_splits], num_kv_splits int32 [T], kv_indices int64 [T * context_len];
    0.5.4 and 0.5.10 also custom_mask uint8 [T * context_len]; 0.5.23 also uneven_batch int32
    [1] and the lean-decode partials lean_Mp, lean_Lp fp32 [SMs, 16], lean_Op fp32 [SMs, 16,
    v_head_dim], lean_locks int32 [SMs]. v_head_dim is the value buffer's width: the latent's
    kv_lora_rank for MLA."""
    cfg, tokens, context = s.cfg, s.max_bs, s.context_len
    heads = cfg.num_heads // s.tp_size
    v_head_dim = cfg.mla.kv_lora_rank if cfg.mla is not None else cfg.head_dim
    splits = _triton_kv_splits(s, release)
    total = tokens * heads * splits * (v_head_dim + 1) * FP32_BYTES
    total += tokens * INT32_BYTES + tokens * context * INT64_BYTES
    if release.triton_custom_mask:
        total += tokens * context * UINT8_BYTES
    if release.triton_lean_and_mla_splits:
        sms = s.gpu.sm_count
        total += INT32_BYTES + sms * INT32_BYTES  # uneven_batch, lean_locks
        total += sms * _LEAN_BLOCK_M * (2 + v_head_dim) * FP32_BYTES  # lean Mp, Lp, Op
    return total


def _triton_kv_splits(s: _Shape, release: _Release) -> int:
    """TritonAttnBackend.__init__ max_kv_splits: the server default, which 0.5.23 raises for
    MLA to min(next_pow2(SMs), next_pow2(ceil(context / 32))) (_mla_decode_kv_splits_cap)."""
    if s.cfg.mla is None or not release.triton_lean_and_mla_splits or s.gpu.sm_count <= 0:
        return TRITON_MAX_KV_SPLITS
    by_context = -(-s.context_len // _MLA_DECODE_MIN_BLOCK_KV)
    cap = min(_next_power_of_2(s.gpu.sm_count), _next_power_of_2(by_context))
    return max(TRITON_MAX_KV_SPLITS, cap)


def _next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 0 else 1


_ATTENTION_BYTES = {"flashinfer": _flashinfer_bytes, "fa3": _fa3_bytes, "triton": _triton_bytes}
