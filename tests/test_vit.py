"""The vision tower against transformers' Qwen2.5-VL vision model, and its grid layouts."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cgtool.model.vit import VisionTower, build_vision_tower, vision_layout
from cgtool.specs.vision import load_vision_preset

# A toy Qwen2.5-VL tower: windows of 2x2 merge units (4x4 patches), full attention in
# blocks 1 and 3, every kind of layer present.
TINY = dataclasses.replace(
    load_vision_preset(), name="tiny-vl", depth=4, hidden_size=64, intermediate_size=96,
    num_heads=4, window_size=56, fullatt_block_indexes=(1, 3), out_hidden_size=48,
)


def _hf_tower(seed: int = 0) -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    module = pytest.importorskip("transformers.models.qwen2_5_vl.modeling_qwen2_5_vl")
    config = transformers.Qwen2_5_VLVisionConfig(
        depth=TINY.depth, hidden_size=TINY.hidden_size, intermediate_size=TINY.intermediate_size,
        num_heads=TINY.num_heads, in_channels=TINY.in_channels, patch_size=TINY.patch_size,
        temporal_patch_size=TINY.temporal_patch_size, spatial_merge_size=TINY.spatial_merge_size,
        window_size=TINY.window_size, fullatt_block_indexes=list(TINY.fullatt_block_indexes),
        out_hidden_size=TINY.out_hidden_size,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    hf = module.Qwen2_5_VisionTransformerPretrainedModel(config).float().eval()
    with torch.no_grad():
        for param in hf.parameters():  # HF initialises norms to 1 and biases to 0: perturb all
            param.normal_(std=0.1)
    return hf


def _copy_weights(hf: torch.nn.Module, tower: VisionTower) -> None:
    source = hf.state_dict()
    target: dict[str, torch.Tensor] = {
        "patch_embed.weight": source["patch_embed.proj.weight"].reshape(TINY.hidden_size, -1),
        "merger.norm": source["merger.ln_q.weight"],
    }
    for name in ("weight", "bias"):
        target[f"merger.fc1.{name}"] = source[f"merger.mlp.0.{name}"]
        target[f"merger.fc2.{name}"] = source[f"merger.mlp.2.{name}"]
    for i in range(TINY.depth):
        b = f"blocks.{i}."
        target[b + "norm1"] = source[b + "norm1.weight"]
        target[b + "norm2"] = source[b + "norm2.weight"]
        for name in ("weight", "bias"):
            for part in ("attn.qkv", "attn.proj", "mlp.down_proj"):
                target[f"{b}{part}.{name}"] = source[f"{b}{part}.{name}"]
            target[f"{b}mlp.gate_up_proj.{name}"] = torch.cat(
                [source[f"{b}mlp.gate_proj.{name}"], source[f"{b}mlp.up_proj.{name}"]]
            )
    tower.load_state_dict(target, strict=True)


@pytest.mark.parametrize(
    "grids",
    [
        [(8, 8)],  # one window: every block attends to the whole image
        [(12, 16)],  # 3x4 full windows
        [(10, 14)],  # 5x7 merge units: the last window row and column are short
        [(10, 14), (6, 4)],  # two images: full attention stays inside each
    ],
)
def test_tower_matches_transformers_qwen2_5_vl(grids: list[tuple[int, int]]) -> None:
    hf = _hf_tower()
    tower = build_vision_tower(TINY, device="cpu", dtype=torch.float32)
    _copy_weights(hf, tower)
    layout = vision_layout(grids, TINY)
    patches = torch.randn(layout.num_patches, tower.patch_dim, generator=torch.Generator().manual_seed(1))
    grid_thw = torch.tensor([[1, r, c] for r, c in grids])
    with torch.no_grad():
        expected = hf(patches, grid_thw).pooler_output
        got = tower(patches, layout)
    assert got.shape == (layout.num_patches // 4, TINY.out_hidden_size)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_window_segments_pad_short_windows_and_mask_their_keys() -> None:
    layout = vision_layout([(10, 14)], TINY)  # 5x7 units in 2x2 windows: 3x4 windows
    segments = layout.windows
    assert segments.gather is not None and segments.key_mask is not None
    assert segments.gather.shape == (12, 16)  # 12 windows of at most 4 units x 4 patches
    assert int(segments.key_mask.sum()) == layout.num_patches == 140
    assert segments.scatter is not None and segments.scatter.shape == (140,)


def test_full_windows_need_no_mask_and_one_image_no_gather() -> None:
    layout = vision_layout([(12, 16)], TINY)
    assert layout.windows.key_mask is None
    assert layout.full.gather is None and layout.full.scatter is None


def test_window_order_is_a_permutation_of_merge_units() -> None:
    layout = vision_layout([(10, 14), (6, 4)], TINY)
    units = layout.num_patches // 4
    assert sorted(layout.window_index.tolist()) == list(range(units))
    assert torch.equal(layout.window_index[layout.reverse_index], torch.arange(units))


def test_grid_off_the_merge_grid_is_refused() -> None:
    with pytest.raises(ValueError, match="merge"):
        vision_layout([(9, 14)], TINY)


def test_random_tower_has_the_presets_parameter_count() -> None:
    tower = build_vision_tower(TINY, device="meta", dtype=torch.bfloat16)
    dim, inter, unit = TINY.hidden_size, TINY.intermediate_size, TINY.hidden_size * 4
    per_block = 2 * dim + (dim * 3 * dim + 3 * dim) + (dim * dim + dim) + (dim * 2 * inter + 2 * inter) \
        + (inter * dim + dim)
    merger = dim + unit * unit + unit + unit * TINY.out_hidden_size + TINY.out_hidden_size
    expected = tower.patch_dim * dim + TINY.depth * per_block + merger
    assert sum(p.numel() for p in tower.parameters()) == expected
