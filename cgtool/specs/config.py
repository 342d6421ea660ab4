"""Model shapes: a frozen ModelConfig read from a HF config.json or a built-in preset."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from cgtool.errors import ConfigError, shown_integer
from cgtool.specs.config_parts import MlaConfig, MoeConfig, RopeScaling, expected_experts
from cgtool.units import BF16_BYTES

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "DeepseekV2ForCausalLM",
)
_REQUIRED_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)


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
    moe: MoeConfig | None = None
    # With MLA, num_kv_heads and head_dim describe the attention the kernels see, as SGLang's
    # MLA backends see it: one latent "head" of kv_lora_rank + qk_rope_head_dim (the
    # absorbed form), which is also the one buffer per layer the KV pool keeps.
    mla: MlaConfig | None = None

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

    @property
    def rotary_dim(self) -> int:
        return self.mla.qk_rope_head_dim if self.mla else self.head_dim

    @property
    def kv_buffers_per_layer(self) -> int:
        """K and V apart, or MLA's one latent buffer (its first kv_lora_rank dims serve as V)."""
        return 1 if self.mla else 2

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.moe.first_dense_layers if self.moe else 0

    @property
    def expert_params(self) -> int:
        """One routed expert of one layer (gate, up, down); 0 for a dense model."""
        return 3 * self.hidden_size * self.moe.expert_intermediate_size if self.moe else 0

    def is_moe_layer(self, layer_id: int) -> bool:
        return self.moe is not None and layer_id >= self.moe.first_dense_layers

    def _attention_params(self) -> int:
        h, m = self.hidden_size, self.mla
        if m is not None:
            q = h * self.num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim)
            kv_a = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank  # + its norm
            kv_b = m.kv_lora_rank * self.num_heads * (m.qk_nope_head_dim + m.v_head_dim)
            return q + kv_a + kv_b + self.num_heads * m.v_head_dim * h
        attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        if self.qkv_bias:
            attn += self.q_size + 2 * self.kv_size
        if self.qk_norm:
            attn += 2 * self.head_dim
        return attn

    def dense_param_count(self) -> int:
        """Every parameter but the routed experts: what each forward reads whatever routes."""
        h, moe = self.hidden_size, self.moe
        mlp_dense = 3 * h * self.intermediate_size
        layers = self.num_layers * (self._attention_params() + 2 * h)
        layers += (self.num_layers - self.num_moe_layers) * mlp_dense
        if moe is not None:  # the router, and the shared experts every token passes through
            shared = moe.num_shared_experts * self.expert_params
            layers += self.num_moe_layers * (h * moe.num_experts + shared)
        embed = self.vocab_size * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return layers + embed + head + h

    def param_count(self) -> int:
        return int(self.params_with_experts(self.moe.num_experts if self.moe else 0))

    def active_param_count(self) -> int:
        """Parameters one token reads: the dense part and its top-k experts per MoE layer."""
        return int(self.params_with_experts(self.moe.top_k if self.moe else 0))

    def params_with_experts(self, experts: Any) -> Any:
        """The dense part plus `experts` routed experts in each MoE layer (a number, or an
        array of expected counts): what a forward that reaches that many experts reads."""
        return self.dense_param_count() + self.num_moe_layers * experts * self.expert_params

    def weight_bytes_read(self, tokens: Any, dtype_bytes: int = BF16_BYTES) -> Any:
        """Weight bytes a forward over `tokens` rows streams (a number or an array): all of a
        dense model; of a MoE model the dense part and the experts its tokens route to."""
        if self.moe is None:
            return tokens * 0 + self.weight_bytes(dtype_bytes)
        hit = expected_experts(self.moe.num_experts, self.moe.top_k, tokens)
        return self.params_with_experts(hit) * dtype_bytes

    def weight_bytes(self, dtype_bytes: int = BF16_BYTES) -> int:
        return self.param_count() * dtype_bytes

    def kv_bytes_per_token(self, dtype_bytes: int = BF16_BYTES) -> int:
        return self.kv_buffers_per_layer * self.num_layers * self.kv_size * dtype_bytes

    def config_hash(self) -> str:
        fields = asdict(self) | {"name": ""}
        # Absent MoE and MLA leave the blob as it was before they existed, so that dense
        # models keep the hashes that saved reports carry.
        fields = {k: v for k, v in fields.items() if not (k in ("moe", "mla") and v is None)}
        blob = json.dumps(fields, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


_MAX_DIM = 1 << 24  # no real model comes near: beyond it a value is a typo or garbage
_MAX_CONTEXT = 1 << 26
_MAX_NUMBER = 1e300  # a float; an integer past it is refused before float() overflows on it


def _whole(raw: dict[str, Any], key: str, source: str, default: int | None = None,
           limit: int = _MAX_DIM) -> int:
    """A positive whole number (5 or 5.0), or a ConfigError naming the key."""
    value = raw.get(key, default)
    # The range first: a JSON integer may have hundreds of digits, which float() cannot take.
    ok = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and 1 <= value <= limit
        and float(value).is_integer()
    )
    if not ok:
        raise ConfigError(
            f"{source}: '{key}' must be a whole number from 1 to {limit:,}, not {_shown(value)}",
            "Fix config.json.",
        )
    return int(value)


def _shown(value: Any) -> str:
    """A config value for an error message, cut where it is long (an integer of 400 digits)."""
    text = shown_integer(value) if isinstance(value, int) and not isinstance(value, bool) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _optional_whole(raw: dict[str, Any], key: str, source: str, default: int) -> int:
    """HF writes null for "not set" (e.g. head_dim): then the default applies."""
    return default if raw.get(key) is None else _whole(raw, key, source)


def _positive(raw: dict[str, Any], key: str, source: str, default: float) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < _MAX_NUMBER:
        raise ConfigError(f"{source}: '{key}' must be a positive number, not {_shown(value)}", "Fix config.json.")
    return float(value)


def _architecture(raw: dict[str, Any], source: str) -> str:
    archs = raw.get("architectures") or []
    names = archs if isinstance(archs, list) else [archs]
    arch = next((a for a in names if isinstance(a, str) and a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        raise ConfigError(
            f"{source}: architecture {archs!r} is not supported" if archs else f"{source}: no architectures listed",
            f"Supported: {', '.join(SUPPORTED_ARCHITECTURES)}.",
        )
    return arch


def parse_hf_config(raw: dict[str, Any], name: str, source: str = "config.json") -> ModelConfig:
    """Build a ModelConfig from the dict of a HF config.json; `source` names it in errors."""
    arch = _architecture(raw, source)
    for key in _REQUIRED_KEYS:
        if key not in raw:
            raise ConfigError(f"{source}: required key '{key}' is missing", "Fix config.json.")
    heads = _whole(raw, "num_attention_heads", source)
    hidden = _whole(raw, "hidden_size", source)
    kv_heads = _optional_whole(raw, "num_key_value_heads", source, heads)
    if heads % kv_heads:
        raise ConfigError(
            f"{source}: num_attention_heads ({heads}) is not a multiple of num_key_value_heads ({kv_heads})",
            "Fix config.json.",
        )
    rope = raw.get("rope_parameters") if isinstance(raw.get("rope_parameters"), dict) else {}
    mla = _parse_mla(raw, source) if arch == "DeepseekV2ForCausalLM" else None
    if mla is not None:
        kv_heads = 1
    return ModelConfig(
        name=name,
        architecture=arch,
        vocab_size=_whole(raw, "vocab_size", source, limit=1 << 28),
        hidden_size=hidden,
        intermediate_size=_whole(raw, "intermediate_size", source),
        num_layers=_whole(raw, "num_hidden_layers", source, limit=4096),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=mla.kv_lora_rank + mla.qk_rope_head_dim if mla else
        _optional_whole(raw, "head_dim", source, max(1, hidden // heads)),
        max_context_len=_whole(raw, "max_position_embeddings", source, 4096, limit=_MAX_CONTEXT),
        rms_norm_eps=_positive(raw, "rms_norm_eps", source, 1e-6),
        rope_theta=_positive(raw if "rope_theta" in raw else rope, "rope_theta", source, 10000.0),
        rope_scaling=_parse_rope_scaling(raw, source),
        tie_word_embeddings=raw.get("tie_word_embeddings", False) is True,
        qkv_bias=arch == "Qwen2ForCausalLM" or raw.get("attention_bias", False) is True,
        qk_norm=arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"),
        moe=_parse_moe(raw, arch, source),
        mla=mla,
    )


def _unsupported(source: str, key: str, value: Any, supported: str) -> ConfigError:
    return ConfigError(
        f"{source}: '{key}' {value!r} is a MoE/MLA variant cgtool does not support",
        f"cgtool supports {supported}.",
    )


def _parse_moe(raw: dict[str, Any], arch: str, source: str) -> MoeConfig | None:
    """Qwen3-MoE's and DeepSeek-V2's sparse MLP; anything routed otherwise is refused by
    naming the field, since a silently dense model would plan the wrong weights."""
    if arch == "Qwen3MoeForCausalLM":
        if raw.get("decoder_sparse_step", 1) != 1:
            raise _unsupported(source, "decoder_sparse_step", raw["decoder_sparse_step"], "1")
        if raw.get("mlp_only_layers"):
            raise _unsupported(source, "mlp_only_layers", raw["mlp_only_layers"], "[] (none)")
        # transformers 5 writes num_local_experts where the published configs say num_experts
        key = "num_experts" if "num_experts" in raw else "num_local_experts"
        experts, first_dense, shared = _whole(raw, key, source), 0, 0
    elif arch == "DeepseekV2ForCausalLM":
        for key, allowed in _DEEPSEEK_ROUTING.items():
            if raw.get(key, allowed[0]) not in allowed:
                raise _unsupported(source, key, raw[key], " or ".join(map(repr, allowed)))
        experts = _whole(raw, "n_routed_experts", source)
        shared = _optional_whole(raw, "n_shared_experts", source, 0) if raw.get("n_shared_experts") else 0
        first_dense = 0 if not raw.get("first_k_dense_replace") else _whole(raw, "first_k_dense_replace", source)
    else:
        return None
    top_k = _whole(raw, "num_experts_per_tok", source, limit=experts)
    return MoeConfig(
        num_experts=experts,
        top_k=top_k,
        expert_intermediate_size=_whole(raw, "moe_intermediate_size", source),
        num_shared_experts=shared,
        first_dense_layers=min(first_dense, _whole(raw, "num_hidden_layers", source, limit=4096)),
        norm_topk_prob=raw.get("norm_topk_prob", False) is True,
        routed_scaling_factor=_positive(raw, "routed_scaling_factor", source, 1.0),
    )


# DeepSeek-V2-Lite's routing: softmax scores, plain top-k over all experts, experts in every
# layer after the dense ones. V2's group-limited and V3's biased routing are not modelled.
_DEEPSEEK_ROUTING: dict[str, tuple[Any, ...]] = {
    "topk_method": ("greedy",),
    "scoring_func": ("softmax",),
    "moe_layer_freq": (1,),
}


def _parse_mla(raw: dict[str, Any], source: str) -> MlaConfig:
    if raw.get("q_lora_rank") is not None:
        raise _unsupported(source, "q_lora_rank", raw["q_lora_rank"], "null (DeepSeek-V2-Lite's q)")
    if raw.get("attention_bias", False) is not False:
        raise _unsupported(source, "attention_bias", raw["attention_bias"], "false")
    return MlaConfig(
        kv_lora_rank=_whole(raw, "kv_lora_rank", source),
        qk_nope_head_dim=_whole(raw, "qk_nope_head_dim", source),
        qk_rope_head_dim=_whole(raw, "qk_rope_head_dim", source),
        v_head_dim=_whole(raw, "v_head_dim", source),
    )


def _parse_rope_scaling(raw: dict[str, Any], source: str) -> RopeScaling | None:
    scaling = raw.get("rope_scaling") or raw.get("rope_parameters")
    if not scaling:
        return None
    if not isinstance(scaling, dict):
        raise ConfigError(f"{source}: rope_scaling must be an object, not {scaling!r}", "Fix config.json.")
    kind = scaling.get("rope_type") or scaling.get("type")
    if kind in (None, "default"):
        return None
    if kind != "llama3":
        raise ConfigError(
            f"{source}: rope_scaling type '{kind}' is not supported",
            "Supported: llama3 (or none).",
        )
    missing = [k for k in _ROPE_KEYS if k not in scaling]
    if missing:
        raise ConfigError(f"{source}: rope_scaling is missing key '{missing[0]}'", "Fix config.json.")
    where = f"{source} rope_scaling"
    return RopeScaling(
        factor=_positive(scaling, "factor", where, 1.0),
        low_freq_factor=_positive(scaling, "low_freq_factor", where, 1.0),
        high_freq_factor=_positive(scaling, "high_freq_factor", where, 1.0),
        original_max_position_embeddings=_whole(
            scaling, "original_max_position_embeddings", where, limit=_MAX_CONTEXT
        ),
    )


_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


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
