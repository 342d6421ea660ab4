"""The ViT session's host-side figures: attention work per grid and the tower's model info."""

from __future__ import annotations

import dataclasses

import torch
from test_vit import TINY

from cgtool.capture.vit import _attention_pairs, vision_model_info
from cgtool.model.vit import vision_layout


def test_attention_pairs_are_the_squared_segment_lengths():
    layout = vision_layout([(10, 14)], TINY)  # 5x7 units in windows of 2x2 units
    # Window lengths in patches: 2 full rows of 3 full windows and a 2-unit-wide one, then a
    # last row one unit high.
    lengths = [16, 16, 16, 8] * 2 + [8, 8, 8, 4]
    assert sum(lengths) == 140
    assert _attention_pairs(layout.windows, 140) == sum(n * n for n in lengths)
    assert _attention_pairs(layout.full, 140) == 140 * 140


def test_full_windows_count_every_pair_inside_them():
    layout = vision_layout([(12, 16)], TINY)  # 3x4 windows of 16 patches, no padding
    assert _attention_pairs(layout.windows, 192) == 12 * 16 * 16


def test_model_info_names_the_tower_and_hashes_its_shapes():
    info = vision_model_info(TINY, torch.bfloat16, weights_bytes=1234)
    assert (info.name, info.architecture, info.num_layers, info.dtype, info.param_bytes) == (
        "tiny-vl", "Qwen2_5_VisionTransformer", 4, "bfloat16", 1234)
    renamed = vision_model_info(dataclasses.replace(TINY, name="other"), torch.bfloat16, 1234)
    deeper = vision_model_info(dataclasses.replace(TINY, depth=5), torch.bfloat16, 1234)
    assert renamed.config_hash == info.config_hash != deeper.config_hash
