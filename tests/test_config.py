import json
from dataclasses import replace
from importlib import resources

import pytest

from cgtool.errors import ConfigError
from cgtool.specs.config import SUPPORTED_ARCHITECTURES, load_model_config, preset_names

# Published parameter counts of the models the presets copy (billions, rounded).
PUBLISHED_PARAMS_B = {
    "llama-3.1-8b": 8.03,
    "llama-3.2-1b": 1.24,
    "qwen2.5-0.5b": 0.49,
    "qwen2.5-7b": 7.62,
    "qwen3-8b": 8.19,
    "mistral-7b": 7.25,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS_B))
def test_preset_parameter_count_matches_published(name):
    cfg = load_model_config(name)
    assert round(cfg.param_count() / 1e9, 2) == PUBLISHED_PARAMS_B[name]


def test_every_preset_parses_with_a_supported_architecture():
    names = preset_names()
    assert {"tiny", *PUBLISHED_PARAMS_B} <= set(names)
    for name in names:
        assert load_model_config(name).architecture in SUPPORTED_ARCHITECTURES


def test_preset_features():
    assert load_model_config("llama-3.1-8b").rope_scaling.factor == 8.0
    assert load_model_config("qwen2.5-7b").qkv_bias
    assert load_model_config("qwen3-8b").qk_norm
    assert load_model_config("qwen3-8b").head_dim == 128
    assert load_model_config("llama-3.2-1b").tie_word_embeddings


def _write(tmp_path, raw):
    (tmp_path / "config.json").write_text(json.dumps(raw))
    return str(tmp_path)


def test_unsupported_architecture_lists_supported(tmp_path):
    with pytest.raises(ConfigError, match="Qwen3ForCausalLM") as err:
        load_model_config(_write(tmp_path, {"architectures": ["GPT2LMHeadModel"]}))
    assert "GPT2LMHeadModel" in str(err.value)


def test_missing_key_is_named(tmp_path):
    raw = json.loads(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 10,
                                 "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2}))
    with pytest.raises(ConfigError, match="intermediate_size"):
        load_model_config(_write(tmp_path, raw))


def test_head_dim_override_and_kv_heads_default(tmp_path):
    raw = {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 10, "hidden_size": 8,
           "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "head_dim": 32}
    cfg = load_model_config(_write(tmp_path, raw))
    assert cfg.head_dim == 32 and cfg.num_kv_heads == 2 and cfg.q_size == 64


def test_unknown_preset_names_the_choices():
    with pytest.raises(ConfigError, match="llama-3.1-8b"):
        load_model_config("no-such-model")


def test_invalid_json_is_one_clear_error(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_model_config(str(tmp_path))


# Published totals of the MoE presets' models (billions): DeepSeek-V2-Lite 15.7, Qwen3-30B-A3B
# 30.5; activated per token 2.4 (DeepSeek, without the embedding table) and 3.3 (Qwen).
@pytest.mark.parametrize("name, total_b", [("deepseek-v2-lite", 15.7), ("qwen3-30b-a3b", 30.5)])
def test_moe_preset_total_parameters_match_published(name, total_b):
    assert round(load_model_config(name).param_count() / 1e9, 1) == total_b


def test_moe_presets_activate_the_published_share_per_token():
    ds, qwen = load_model_config("deepseek-v2-lite"), load_model_config("qwen3-30b-a3b")
    embedding = ds.vocab_size * ds.hidden_size
    assert 2.4 <= (ds.active_param_count() - embedding) / 1e9 < 2.5
    assert 3.3 <= qwen.active_param_count() / 1e9 < 3.4


def test_moe_preset_shapes():
    ds, qwen = load_model_config("deepseek-v2-lite"), load_model_config("qwen3-30b-a3b")
    assert (ds.moe.num_experts, ds.moe.top_k, ds.moe.num_shared_experts) == (64, 6, 2)
    assert ds.num_moe_layers == ds.num_layers - 1 and not ds.is_moe_layer(0) and ds.is_moe_layer(1)
    assert (qwen.moe.num_experts, qwen.moe.top_k, qwen.moe.norm_topk_prob) == (128, 8, True)
    assert qwen.num_moe_layers == qwen.num_layers and qwen.num_kv_heads == 4 and qwen.qk_norm


def test_mla_attends_one_latent_head_of_rank_plus_rope():
    ds = load_model_config("deepseek-v2-lite")
    assert (ds.mla.kv_lora_rank, ds.mla.qk_rope_head_dim) == (512, 64)
    assert (ds.num_kv_heads, ds.head_dim, ds.rotary_dim) == (1, 576, 64)
    # one buffer of 576 bf16 values per layer: no separate V
    assert ds.kv_bytes_per_token(2) == ds.num_layers * (512 + 64) * 2


def _moe_raw(arch, **changes):
    raw = json.loads(
        (resources.files("cgtool") / "presets" / f"{arch}.json").read_text()
    )
    return raw | changes


@pytest.mark.parametrize("preset, key, value", [
    ("qwen3-30b-a3b", "decoder_sparse_step", 2),
    ("qwen3-30b-a3b", "mlp_only_layers", [0, 3]),
    ("deepseek-v2-lite", "topk_method", "group_limited_greedy"),
    ("deepseek-v2-lite", "scoring_func", "sigmoid"),
    ("deepseek-v2-lite", "moe_layer_freq", 2),
    ("deepseek-v2-lite", "q_lora_rank", 1536),
])
def test_unsupported_moe_or_mla_variant_names_the_field(tmp_path, preset, key, value):
    with pytest.raises(ConfigError, match=f"'{key}'") as err:
        load_model_config(_write(tmp_path, _moe_raw(preset, **{key: value})))
    assert "\n" not in str(err.value)


def test_transformers_5_expert_count_key_is_read(tmp_path):
    raw = _moe_raw("qwen3-30b-a3b")
    raw["num_local_experts"] = raw.pop("num_experts")
    assert load_model_config(_write(tmp_path, raw)).moe.num_experts == 128


def test_top_k_above_the_expert_count_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="num_experts_per_tok"):
        load_model_config(_write(tmp_path, _moe_raw("qwen3-30b-a3b", num_experts_per_tok=129)))


def test_moe_and_mla_shapes_change_the_config_hash():
    qwen = load_model_config("qwen3-30b-a3b")
    assert qwen.config_hash() != replace(qwen, moe=replace(qwen.moe, top_k=4)).config_hash()
    ds = load_model_config("deepseek-v2-lite")
    assert ds.config_hash() != replace(ds, mla=replace(ds.mla, kv_lora_rank=256)).config_hash()
