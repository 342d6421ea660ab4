"""Build a CausalLM on the target device: from *.safetensors, or with random weights."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from cgtool.errors import ConfigError
from cgtool.model.llama import CausalLM
from cgtool.model.parallel import RowParallelLinear
from cgtool.runtime.distributed import SINGLE, TensorParallel
from cgtool.specs.config import ModelConfig

# HF checkpoints keep q/k/v and gate/up separate; cgtool fuses them into one matmul each
# (and, with tensor parallelism, keeps this rank's rows of each part).
_FUSED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
# Routed experts come one by one in checkpoints; cgtool stacks them per layer (moe.Experts).
_EXPERT = re.compile(r"(?P<prefix>.+\.experts)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight")


def build_model(
    cfg: ModelConfig,
    *,
    device: torch.device | str,
    dtype: torch.dtype,
    max_positions: int,
    weights_dir: Path | None = None,
    seed: int = 0,
    tp: TensorParallel = SINGLE,
) -> CausalLM:
    """Random weights when `weights_dir` is None: created on the device, never on the host.

    With tensor parallelism each rank holds its slice of the same random weights as TP=1.
    """
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        torch.manual_seed(seed)
        with torch.device(device):
            model = CausalLM(cfg, max_positions, tp)
    finally:
        torch.set_default_dtype(previous)
    if weights_dir is not None:
        load_safetensors(model, weights_dir)
    return model.eval().requires_grad_(False)


def safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        return [folder / name for name in sorted(set(weight_map.values()))]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ConfigError(
            f"{folder}: no *.safetensors weights found",
            "Pass --random-weights to profile with random weights of the same shapes.",
        )
    return files


def _checkpoint_tensors(folder: Path) -> Iterator[tuple[str, Any]]:
    """(name, lazy slice): each rank reads only the rows or columns it keeps."""
    from safetensors import safe_open

    for path in safetensors_files(folder):
        if not path.is_file():
            raise ConfigError(f"{path}: shard named in the index is missing", "Re-download the model.")
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_slice(name)


def load_safetensors(model: CausalLM, folder: Path) -> None:
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for name, tensor in _checkpoint_tensors(folder):
        expert = _EXPERT.fullmatch(name)
        # Names the model keeps as they are (MLA's q_proj) load directly, not into a fused qkv.
        target, part = (name, 0) if name in params else _target_part(name)
        if expert is not None:
            target = f"{expert['prefix']}.{'down_proj' if expert['proj'] == 'down_proj' else 'gate_up_proj'}"
        if target not in params:
            continue  # e.g. rotary inv_freq buffers in old checkpoints
        module = model.get_submodule(target.rsplit(".", 1)[0])
        if expert is not None:
            dst, index, expected = _expert_slot(params[target], int(expert["e"]), expert["proj"])
        else:
            dst, index, expected = _shard_of(module, params[target], part)
        if tuple(tensor.get_shape()) != expected:
            raise ConfigError(
                f"{folder}: tensor {name} has shape {tuple(tensor.get_shape())}, expected {expected}",
                "Check that config.json matches the weights.",
            )
        dst.copy_(tensor[index])
        loaded.add(name)
    missing = _expected_names(model) - loaded
    if missing:
        raise ConfigError(
            f"{folder}: weights are missing tensor {min(missing)} ({len(missing)} missing)",
            "Check the checkpoint, or pass --random-weights.",
        )


def _target_part(name: str) -> tuple[str, int]:
    """The cgtool parameter a checkpoint tensor belongs to, and which fused part it is."""
    parts = name.split(".")
    fused = _FUSED.get(parts[-2]) if len(parts) >= 2 else None
    if fused is None:
        return name, 0
    target_name, part = fused
    return ".".join(parts[:-2] + [target_name, parts[-1]]), part


def _shard_of(
    module: torch.nn.Module, param: torch.Tensor, part: int
) -> tuple[torch.Tensor, tuple[slice, ...], tuple[int, ...]]:
    """(where in `param` it goes, this rank's slice of the tensor, the tensor's full shape)."""
    if isinstance(module, RowParallelLinear):
        (a, b), out_features = module.cols, param.shape[0]
        return param.data, (slice(None), slice(a, b)), (out_features, module.cols_total)
    parts = getattr(module, "parts", None)
    if parts is None:  # norms: every rank holds all of it
        return param.data, (slice(None),), tuple(param.shape)
    (a, b), full = parts[part], module.part_sizes[part]
    offset = sum(stop - start for start, stop in parts[:part])
    return param.data[offset : offset + b - a], (slice(a, b),), (full, *param.shape[1:])


def _expert_slot(
    param: torch.Tensor, expert: int, proj: str
) -> tuple[torch.Tensor, tuple[slice, ...], tuple[int, ...]]:
    """One expert's gate, up or down matrix inside the stacked parameter of its layer."""
    dst = param.data[expert]
    if proj != "down_proj":
        half = dst.shape[0] // 2
        dst = dst[:half] if proj == "gate_proj" else dst[half:]
    return dst, (slice(None),), tuple(dst.shape)


def _expected_names(model: CausalLM) -> set[str]:
    names = set()
    for name, param in model.named_parameters():  # tied lm_head is listed once, as embed_tokens
        if name.endswith((".experts.gate_up_proj", ".experts.down_proj")):
            prefix, stacked = name.rsplit(".", 1)
            projs = ("down_proj",) if stacked == "down_proj" else ("gate_proj", "up_proj")
            names |= {f"{prefix}.{e}.{p}.weight" for e in range(param.shape[0]) for p in projs}
        elif ".qkv_proj." in name:
            names |= {name.replace("qkv_proj", p) for p in ("q_proj", "k_proj", "v_proj")}
        elif ".gate_up_proj." in name:
            names |= {name.replace("gate_up_proj", p) for p in ("gate_proj", "up_proj")}
        else:
            names.add(name)
    return names
