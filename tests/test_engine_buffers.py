"""SGLang's graph-time buffers, recomputed here by hand from the tensors each checked release
(0.5.4, 0.5.10, 0.5.23) allocates."""

import pytest

from cgtool.errors import CgtoolError, InputError
from cgtool.planner.cost import roofline_cost
from cgtool.planner.engine_buffers import (
    CHECKED_VERSIONS,
    check_attention_backend,
    default_attention_backend,
    engine_graph_buffers,
    with_engine_buffers,
)
from cgtool.specs.config import load_model_config
from cgtool.specs.gpus import gpu_spec

# 32 heads of 128, hidden 4096, vocab 128256, context 131072
LLAMA = load_model_config("llama-3.1-8b")
# 16 heads, latent 512, hidden 2048, vocab 102400, context 163840
DEEPSEEK = load_model_config("deepseek-v2-lite")
H100 = gpu_spec("H100-80GB")  # 132 SMs
A100 = gpu_spec("A100-80GB")  # 108 SMs
BS = 72


def _buffers(cfg, backend, version, gpu=H100, bs=BS):
    return engine_graph_buffers(cfg, backend, bs, cfg.max_context_len, gpu, version)


# --- static inputs: the decode runner's tensors at T = B = 72 -----------------------------

@pytest.mark.parametrize("cfg, vocab, hidden", [(LLAMA, 128256, 4096), (DEEPSEEK, 102400, 2048)])
def test_054_static_inputs_are_int32_lengths_and_no_embeds(cfg, vocab, hidden):
    # input_ids, out_cache_loc, positions int64 [72]; mrope_positions int64 [3, 72];
    # req_pool_indices, seq_lens int32 [72]; num_token_non_padded int32 [1];
    # custom_mask bool [72 + 72]; next-token logits fp32 [72, vocab]
    expected = 3 * 72 * 8 + 3 * 72 * 8 + 2 * 72 * 4 + 4 + 144 + 72 * vocab * 4
    assert _buffers(cfg, "fa3", "0.5.4").static_input_bytes == expected


@pytest.mark.parametrize("cfg, vocab, hidden", [(LLAMA, 128256, 4096), (DEEPSEEK, 102400, 2048)])
def test_0510_static_inputs_add_bf16_input_embeds_and_int64_pool_indices(cfg, vocab, hidden):
    # as 0.5.4, plus input_embeds bf16 [72, hidden]; req_pool_indices int64 [72], seq_lens
    # int32 [72]; global_num_tokens_gpu and ..._for_logprob_gpu int32 [1] each
    expected = (3 * 72 * 8 + 3 * 72 * 8 + 72 * hidden * 2 + 72 * 8 + 72 * 4 + 4 + 2 * 4
                + 144 + 72 * vocab * 4)
    assert _buffers(cfg, "fa3", "0.5.10").static_input_bytes == expected


@pytest.mark.parametrize("cfg, vocab, hidden", [(LLAMA, 128256, 4096), (DEEPSEEK, 102400, 2048)])
def test_0523_static_inputs_have_int64_lengths_and_no_padding_count(cfg, vocab, hidden):
    # req_pool_indices and seq_lens int64 [72]; num_token_non_padded only under EP
    expected = (3 * 72 * 8 + 3 * 72 * 8 + 72 * hidden * 2 + 2 * 72 * 8 + 2 * 4
                + 144 + 72 * vocab * 4)
    assert _buffers(cfg, "fa3", "0.5.23").static_input_bytes == expected


# --- FlashInfer: unchanged across releases -------------------------------------------------

@pytest.mark.parametrize("version", CHECKED_VERSIONS)
def test_flashinfer_holds_kv_indices_and_a_mask_of_max_bs_times_context(version):
    # kv_indices int32 [72 * 131072], custom_mask uint8 [72 * 131072], two indptrs int32 [73]
    expected = 72 * 131072 * 4 + 72 * 131072 + 2 * 73 * 4
    assert _buffers(LLAMA, "flashinfer", version).attention_bytes == expected


@pytest.mark.parametrize("version", CHECKED_VERSIONS)
def test_flashinfer_mla_holds_indices_without_a_mask(version):
    # kv_indices int32 [72 * 163840]; qo_indptr, kv_indptr int32 [73]; kv_lens int32 [72]
    expected = 72 * 163840 * 4 + (2 * 73 + 72) * 4
    assert _buffers(DEEPSEEK, "flashinfer", version).attention_bytes == expected


# --- FA3 ------------------------------------------------------------------------------------

@pytest.mark.parametrize("cfg, context", [(LLAMA, 131072), (DEEPSEEK, 163840)])
def test_054_fa3_also_holds_an_encoder_page_table_for_decoder_only_models(cfg, context):
    # page size 1: page_table int32 [72, C]; cache_seqlens int32 [72]; cu_seqlens_q/k int32
    # [73]; strided_indices int64 [C]; encoder_metadata: encoder_page_table int32 [72, C],
    # encoder_lens_int32 int32 [72], encoder_cu_seqlens_k int32 [73]
    base = 72 * context * 4 + 72 * 4 + 2 * 73 * 4 + context * 8
    encoder = 72 * context * 4 + 72 * 4 + 73 * 4
    assert _buffers(cfg, "fa3", "0.5.4").attention_bytes == base + encoder


@pytest.mark.parametrize("cfg, context", [(LLAMA, 131072), (DEEPSEEK, 163840)])
def test_0510_fa3_holds_the_page_table_only(cfg, context):
    expected = 72 * context * 4 + 72 * 4 + 2 * 73 * 4 + context * 8
    assert _buffers(cfg, "fa3", "0.5.10").attention_bytes == expected


@pytest.mark.parametrize("cfg, context, sched", [
    (LLAMA, 131072, (1 + 72 * 4) * 4),  # _sched_meta_buf int32 [1 + round_up(72, 4) * 4]
    (DEEPSEEK, 163840, 0),  # MLA: no scheduler metadata
])
def test_0523_fa3_adds_scheduler_metadata_for_mha(cfg, context, sched):
    expected = 72 * context * 4 + 72 * 4 + 2 * 73 * 4 + context * 8 + sched
    assert _buffers(cfg, "fa3", "0.5.23").attention_bytes == expected


# --- Triton ---------------------------------------------------------------------------------

@pytest.mark.parametrize("version", ["0.5.4", "0.5.10"])
@pytest.mark.parametrize("cfg, context, v_head_dim", [
    (LLAMA, 131072, 128), (DEEPSEEK, 163840, 512),
])
def test_triton_holds_8_split_partials_int64_indices_and_a_mask(version, cfg, context, v_head_dim):
    # attn_logits fp32 [72, heads, 8, v]; attn_lse fp32 [72, heads, 8]; num_kv_splits int32
    # [72]; kv_indices int64 [72 * C]; custom_mask uint8 [72 * C]
    heads = cfg.num_heads
    expected = (72 * heads * 8 * v_head_dim * 4 + 72 * heads * 8 * 4 + 72 * 4
                + 72 * context * 8 + 72 * context)
    assert _buffers(cfg, "triton", version).attention_bytes == expected


def _lean(sms, v_head_dim):
    # lean_Mp, lean_Lp fp32 [SMs, 16]; lean_Op fp32 [SMs, 16, v]; lean_locks int32 [SMs]
    return 2 * sms * 16 * 4 + sms * 16 * v_head_dim * 4 + sms * 4


@pytest.mark.parametrize("gpu, sms", [(H100, 132), (A100, 108)])
def test_0523_triton_mha_drops_the_mask_and_adds_lean_partials(gpu, sms):
    # attn_logits/lse at 8 splits, num_kv_splits int32 [72], uneven_batch int32 [1],
    # kv_indices int64 [72 * 131072]; no custom mask without speculative decoding
    expected = (72 * 32 * 8 * 128 * 4 + 72 * 32 * 8 * 4 + 72 * 4 + 4
                + 72 * 131072 * 8 + _lean(sms, 128))
    assert _buffers(LLAMA, "triton", "0.5.23", gpu).attention_bytes == expected


@pytest.mark.parametrize("gpu, sms, splits", [
    (H100, 132, 256),  # min(next_pow2(132), next_pow2(163840 / 32 = 5120)) = min(256, 8192)
    (A100, 108, 128),
])
def test_0523_triton_mla_splits_grow_to_the_sm_count(gpu, sms, splits):
    expected = (72 * 16 * splits * 512 * 4 + 72 * 16 * splits * 4 + 72 * 4 + 4
                + 72 * 163840 * 8 + _lean(sms, 512))
    assert _buffers(DEEPSEEK, "triton", "0.5.23", gpu).attention_bytes == expected


def test_no_decode_graphs_means_no_buffers():
    assert _buffers(LLAMA, "flashinfer", "0.5.23", bs=0).total_bytes == 0


# --- default backend ------------------------------------------------------------------------

@pytest.mark.parametrize("model, gpu, version, backend", [
    ("llama-3.1-8b", "H100-80GB", "0.5.4", "fa3"),
    ("mistral-7b", "H100-80GB", "0.5.4", "flashinfer"),  # not an FA3-default architecture
    ("llama-3.1-8b", "B200", "0.5.4", "flashinfer"),
    ("llama-3.1-8b", "A100-80GB", "0.5.4", "flashinfer"),
    ("deepseek-v2-lite", "H200", "0.5.4", "fa3"),
    ("deepseek-v2-lite", "B200", "0.5.4", "flashinfer"),
    ("deepseek-v2-lite", "A100-80GB", "0.5.4", "triton"),
    ("llama-3.1-8b", "H100-80GB", "0.5.10", "fa3"),
    ("mistral-7b", "H100-80GB", "0.5.10", "fa3"),  # FA3 for every MHA model on Hopper
    ("llama-3.1-8b", "B200", "0.5.10", None),  # trtllm_mha: not modelled
    ("llama-3.1-8b", "A100-80GB", "0.5.10", "flashinfer"),
    ("deepseek-v2-lite", "H100-80GB", "0.5.10", "fa3"),
    ("deepseek-v2-lite", "B200", "0.5.10", "flashinfer"),
    ("deepseek-v2-lite", "A100-80GB", "0.5.10", "triton"),
    ("mistral-7b", "H100-80GB", "0.5.23", "fa3"),
    ("llama-3.1-8b", "B200", "0.5.23", None),
    ("llama-3.1-8b", "L40S", "0.5.23", "flashinfer"),
    ("deepseek-v2-lite", "H100-80GB", "0.5.23", "fa3"),
    ("deepseek-v2-lite", "B200", "0.5.23", "flashinfer"),
    ("deepseek-v2-lite", "A100-80GB", "0.5.23", "triton"),
])
def test_default_backend_is_that_releases_own_choice(model, gpu, version, backend):
    assert default_attention_backend(load_model_config(model), gpu_spec(gpu), version) == backend


def test_an_unchecked_release_has_no_modelled_default():
    assert default_attention_backend(LLAMA, H100, "0.5.3.dev") is None


# --- graph memory ---------------------------------------------------------------------------

@pytest.mark.parametrize("version", CHECKED_VERSIONS)
@pytest.mark.parametrize("backend", ["flashinfer", "fa3", "triton"])
def test_graph_memory_counts_the_buffers_at_the_largest_decode_size(version, backend):
    cost = roofline_cost(LLAMA, H100, max_bs=256, max_tokens=512)
    with_buffers = with_engine_buffers(cost, LLAMA, backend, 131072, H100, version)
    sizes, tokens = [1, 8, 48, 200], [64, 512]
    buffers = engine_graph_buffers(LLAMA, backend, 200, 131072, H100, version).total_bytes
    assert with_buffers.graph_bytes(sizes, tokens) == cost.graph_bytes(sizes, tokens) + buffers
    assert with_buffers.graph_bytes([], tokens) == cost.graph_bytes([], tokens)


# --- refusals -------------------------------------------------------------------------------

@pytest.mark.parametrize("name, engine, version, words", [
    ("fa4", "sglang", None, "--attention-backend 'fa4'"),
    ("fa3", "vllm", None, "--engine is vllm"),
    ("fa3", "sglang", "0.5.3.dev", "0.5.3.dev's graph buffers were not checked"),
])
def test_unknown_or_misplaced_backend_is_refused_naming_the_flag(name, engine, version, words):
    with pytest.raises(InputError, match=words):
        check_attention_backend(name, engine, version)


def test_an_unknown_release_is_refused_naming_engine_version():
    with pytest.raises(CgtoolError, match="--engine-version"):
        check_attention_backend("fa3", "sglang", "9.9")
