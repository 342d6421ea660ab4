"""SGLang's graph-time buffers, recomputed here by hand from the tensors SGLang 0.5.4 allocates."""

import pytest

from cgtool.config import load_model_config
from cgtool.errors import InputError
from cgtool.gpus import gpu_spec
from cgtool.planner.cost import roofline_cost
from cgtool.planner.engine_buffers import (
    check_attention_backend,
    default_attention_backend,
    engine_graph_buffers,
    with_engine_buffers,
)

LLAMA = load_model_config("llama-3.1-8b")  # 32 heads of 128, vocab 128256, context 131072
DEEPSEEK = load_model_config("deepseek-v2-lite")  # 16 heads, latent 512 + 64, vocab 102400, context 163840
BS = 72


def test_static_inputs_are_the_runners_tensors_at_max_bs():
    # input_ids, out_cache_loc, positions: 3 x int64 [72]; mrope_positions int64 [3, 72];
    # req_pool_indices, seq_lens int32 [72]; num_token_non_padded int32 [1]; custom_mask bool
    # [72 + 72]; next-token logits fp32 [72, 128256].
    expected = 3 * 72 * 8 + 3 * 72 * 8 + 2 * 72 * 4 + 4 + 144 + 72 * 128256 * 4
    assert engine_graph_buffers(LLAMA, "fa3", BS, 131072).static_input_bytes == expected


def test_flashinfer_holds_kv_indices_and_a_mask_of_max_bs_times_context():
    # kv_indices int32 [72 * 131072], custom_mask uint8 [72 * 131072], two indptrs int32 [73]
    expected = 72 * 131072 * 4 + 72 * 131072 + 2 * 73 * 4
    assert engine_graph_buffers(LLAMA, "flashinfer", BS, 131072).attention_bytes == expected


def test_flashinfer_mla_holds_indices_without_a_mask():
    # kv_indices int32 [72 * 163840]; qo_indptr, kv_indptr int32 [73]; kv_lens int32 [72]
    expected = 72 * 163840 * 4 + (2 * 73 + 72) * 4
    assert engine_graph_buffers(DEEPSEEK, "flashinfer", BS, 163840).attention_bytes == expected


def test_fa3_holds_a_page_table_of_max_bs_by_context_pages():
    # page size 1: page_table int32 [72, 131072]; cache_seqlens int32 [72]; cu_seqlens_q/k
    # int32 [73]; strided_indices int64 [131072]
    expected = 72 * 131072 * 4 + 72 * 4 + 2 * 73 * 4 + 131072 * 8
    assert engine_graph_buffers(LLAMA, "fa3", BS, 131072).attention_bytes == expected


@pytest.mark.parametrize("cfg, context, v_head_dim", [(LLAMA, 131072, 128), (DEEPSEEK, 163840, 512)])
def test_triton_holds_split_partials_and_int64_indices(cfg, context, v_head_dim):
    # attn_logits fp32 [72, heads, 8, v]; attn_lse fp32 [72, heads, 8]; num_kv_splits int32 [72];
    # kv_indices int64 [72 * context]; custom_mask uint8 [72 * context]
    heads = cfg.num_heads
    expected = (72 * heads * 8 * v_head_dim * 4 + 72 * heads * 8 * 4 + 72 * 4
                + 72 * context * 8 + 72 * context)
    assert engine_graph_buffers(cfg, "triton", BS, context).attention_bytes == expected


def test_no_decode_graphs_means_no_buffers():
    assert engine_graph_buffers(LLAMA, "flashinfer", 0, 131072).total_bytes == 0


@pytest.mark.parametrize("model, gpu, backend", [
    ("llama-3.1-8b", "H100-80GB", "fa3"),
    ("mistral-7b", "H100-80GB", "flashinfer"),  # not among SGLang's FA3-default architectures
    ("llama-3.1-8b", "A100-80GB", "flashinfer"),
    ("deepseek-v2-lite", "H200", "fa3"),
    ("deepseek-v2-lite", "B200", "flashinfer"),
    ("deepseek-v2-lite", "A100-80GB", "triton"),
])
def test_default_backend_is_sglangs_own_choice(model, gpu, backend):
    assert default_attention_backend(load_model_config(model), gpu_spec(gpu)) == backend


def test_graph_memory_counts_the_buffers_at_the_largest_decode_size():
    h100 = gpu_spec("H100-80GB")
    cost = roofline_cost(LLAMA, h100, max_bs=256, max_tokens=512)
    with_buffers = with_engine_buffers(cost, LLAMA, "flashinfer", 131072)
    sizes, tokens = [1, 8, 48, 200], [64, 512]
    buffers = engine_graph_buffers(LLAMA, "flashinfer", 200, 131072).total_bytes
    assert with_buffers.graph_bytes(sizes, tokens) == cost.graph_bytes(sizes, tokens) + buffers
    assert with_buffers.graph_bytes([], tokens) == cost.graph_bytes([], tokens)


@pytest.mark.parametrize("name, engine, words", [
    ("fa4", "sglang", "--attention-backend 'fa4'"),
    ("fa3", "vllm", "--engine is vllm"),
])
def test_unknown_or_misplaced_backend_is_refused_naming_the_flag(name, engine, words):
    with pytest.raises(InputError, match=words):
        check_attention_backend(name, engine)
