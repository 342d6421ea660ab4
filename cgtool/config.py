"""Model shapes: a frozen ModelConfig read from a HF config.json or a built-in preset."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from cgtool.errors import ConfigError

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)
_REQUIRED_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """Llama 3's frequency-dependent rope scaling (rope_type "llama3")."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True, slots=True)
class ModelConfig:
    name: str
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_context_len: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"{self.name}: num_attention_heads ({self.num_heads}) is not a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})",
                "Fix config.json.",
            )

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def param_count(self) -> int:
        h, i = self.hidden_size, self.intermediate_size
        attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        if self.qkv_bias:
            attn += self.q_size + 2 * self.kv_size
        if self.qk_norm:
            attn += 2 * self.head_dim
        layer = attn + 3 * h * i + 2 * h
        embed = self.vocab_size * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.num_layers * layer + embed + head + h

    def weight_bytes(self, dtype_bytes: int = 2) -> int:
        return self.param_count() * dtype_bytes

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return 2 * self.num_layers * self.kv_size * dtype_bytes

    def config_hash(self) -> str:
        blob = json.dumps(asdict(self) | {"name": ""}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def parse_hf_config(raw: dict[str, Any], name: str, source: str = "config.json") -> ModelConfig:
    """Build a ModelConfig from the dict of a HF config.json; `source` names it in errors."""
    archs = raw.get("architectures") or []
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        raise ConfigError(
            f"{source}: architecture {archs or 'missing'} is not supported",
            f"Supported: {', '.join(SUPPORTED_ARCHITECTURES)}.",
        )
    for key in _REQUIRED_KEYS:
        if key not in raw:
            raise ConfigError(f"{source}: required key '{key}' is missing", "Fix config.json.")
    heads = int(raw["num_attention_heads"])
    head_dim = raw.get("head_dim") or int(raw["hidden_size"]) // heads
    return ModelConfig(
        name=name,
        architecture=arch,
        vocab_size=int(raw["vocab_size"]),
        hidden_size=int(raw["hidden_size"]),
        intermediate_size=int(raw["intermediate_size"]),
        num_layers=int(raw["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(head_dim),
        max_context_len=int(raw.get("max_position_embeddings", 4096)),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=float(raw.get("rope_theta", (raw.get("rope_parameters") or {}).get("rope_theta", 10000.0))),
        rope_scaling=_parse_rope_scaling(raw, source),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        qkv_bias=arch == "Qwen2ForCausalLM" or bool(raw.get("attention_bias", False)),
        qk_norm=arch == "Qwen3ForCausalLM",
    )


def _parse_rope_scaling(raw: dict[str, Any], source: str) -> RopeScaling | None:
    scaling = raw.get("rope_scaling") or raw.get("rope_parameters")
    if not scaling:
        return None
    kind = scaling.get("rope_type") or scaling.get("type")
    if kind in (None, "default"):
        return None
    if kind != "llama3":
        raise ConfigError(
            f"{source}: rope_scaling type '{kind}' is not supported",
            "Supported: llama3 (or none).",
        )
    try:
        return RopeScaling(
            factor=float(scaling["factor"]),
            low_freq_factor=float(scaling["low_freq_factor"]),
            high_freq_factor=float(scaling["high_freq_factor"]),
            original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
        )
    except KeyError as missing:
        raise ConfigError(
            f"{source}: rope_scaling is missing key {missing}", "Fix config.json."
        ) from None


def preset_names() -> list[str]:
    folder = resources.files("cgtool") / "presets"
    return sorted(p.name[: -len(".json")] for p in folder.iterdir() if p.name.endswith(".json"))


def load_preset(name: str) -> ModelConfig:
    path = resources.files("cgtool") / "presets" / f"{name}.json"
    if not path.is_file():
        raise ConfigError(
            f"unknown model preset '{name}'",
            f"Use a preset ({', '.join(preset_names())}) or a folder holding config.json.",
        )
    return parse_hf_config(json.loads(path.read_text()), name, f"preset {name}")


def load_model_config(model: str) -> ModelConfig:
    """`model` is a preset name, a folder holding config.json, or a config.json path."""
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    if path.name.endswith(".json") and path.is_file():
        try:
            raw = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc})", "Fix config.json.") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: expected a JSON object", "Fix config.json.")
        return parse_hf_config(raw, path.parent.name or str(path), str(path))
    if Path(model).is_dir():
        raise ConfigError(f"{model}: no config.json in this folder", "Point --model at a HF model folder.")
    return load_preset(model)
