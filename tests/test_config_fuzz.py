"""Fuzzing the HF config.json parser: any input gives a ModelConfig or one ConfigError.

Generated cases per run: 300 random byte strings, 400 mutations of a valid config (wrong
types, huge, negative and non-finite numbers, unicode), 200 deletions of a key and 150
truncations of the file: 1,050 cases.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cgtool.commands.main import app
from cgtool.errors import ConfigError
from cgtool.specs.config import ModelConfig, load_model_config

VALID = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
}
ODD_VALUES = st.one_of(
    st.none(), st.booleans(), st.text(max_size=8), st.integers(-(2**70), 2**70),
    st.integers(10**300, 10**400),  # past what float() takes: JSON integers have no bound
    st.floats(allow_nan=True, allow_infinity=True), st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


def _fuzz(cases: int) -> settings:
    return settings(max_examples=cases, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _load(folder: Path, text: bytes) -> ModelConfig | None:
    (folder / "config.json").write_bytes(text)
    try:
        cfg = load_model_config(str(folder))
    except ConfigError as error:
        message = str(error)
        assert "\n" not in message and str(folder / "config.json") in message
        return None
    # Whatever is accepted is a usable shape: the planner divides and multiplies by these.
    assert cfg.num_heads >= 1 and cfg.num_kv_heads >= 1 and cfg.head_dim >= 1
    assert cfg.num_heads % cfg.num_kv_heads == 0
    assert math.isfinite(cfg.rms_norm_eps) and math.isfinite(cfg.rope_theta)
    return cfg


@_fuzz(300)
@given(st.binary(max_size=300))
def test_random_bytes(tmp_path, data):
    _load(tmp_path, data)


@_fuzz(400)
@given(st.sampled_from(sorted(VALID) + ["head_dim"]), ODD_VALUES)
def test_a_field_of_any_type(tmp_path, key, value):
    raw = dict(VALID, **{key: value})
    _load(tmp_path, json.dumps(raw).encode())


@_fuzz(200)
@given(st.sampled_from(sorted(VALID)), st.sampled_from(sorted(VALID["rope_scaling"])))
def test_a_missing_key(tmp_path, key, rope_key):
    raw = {k: v for k, v in VALID.items() if k != key}
    if key != "rope_scaling":
        raw["rope_scaling"] = {k: v for k, v in VALID["rope_scaling"].items() if k != rope_key}
    _load(tmp_path, json.dumps(raw).encode())


@_fuzz(150)
@given(st.integers(0, len(json.dumps(VALID)) - 1))
def test_a_truncated_file(tmp_path, cut):
    assert _load(tmp_path, json.dumps(VALID).encode()[:cut]) is None


def test_the_valid_config_loads(tmp_path):
    cfg = _load(tmp_path, json.dumps(VALID).encode())
    assert cfg is not None and cfg.head_dim == 16 and cfg.rope_scaling is not None


def test_a_wrong_type_reaches_the_user_as_one_line_and_exit_2(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(VALID, hidden_size="sixty-four")))
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival": 0, "input_len": 10, "output_len": 5}\n')
    result = CliRunner().invoke(app, ["plan", "--trace", str(trace), "--model", str(tmp_path)])
    assert result.exit_code == 2
    assert "'hidden_size' must be a whole number from 1 to 16,777,216, not 'sixty-four'" in result.output
    assert "Traceback" not in result.output


def test_an_integer_too_large_for_a_float_is_refused_in_one_line(tmp_path):
    # json parses 401 digits to an int, which float() cannot take (it raised OverflowError).
    for key in ("num_hidden_layers", "rope_theta"):
        (tmp_path / "config.json").write_text(json.dumps(VALID).replace(
            f'"{key}": {json.dumps(VALID[key])}', f'"{key}": 1{"0" * 400}'))
        try:
            load_model_config(str(tmp_path))
        except ConfigError as error:
            assert "an integer of 401 digits" in str(error) and f"'{key}'" in str(error)
        else:
            raise AssertionError(f"{key} of 401 digits was accepted")
