import json

import pytest

from cgtool.config import SUPPORTED_ARCHITECTURES, load_model_config, preset_names
from cgtool.errors import ConfigError

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
