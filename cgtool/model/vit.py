"""The Qwen2.5-VL vision tower: patch embedding, 2D rotary, window attention, 2x2 patch merger.

Reads as Qwen2.5-VL's vision model does (transformers' Qwen2_5_VisionTransformerPretrainedModel),
with one difference that makes it capturable: everything that depends on the image grid
(the window order, the rotary table, the attention segments that cu_seqlens describes) is
computed once per grid on the host into a `VisionLayout` of static tensors. The forward then
has no host synchronisation and no data-dependent shape, so a CUDA graph of the blocks and
the merger (`encode`) replays for any image of that grid, as SGLang's ViT graphs do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from cgtool.model.fused import apply_rope, rms_norm, silu_and_mul
from cgtool.specs.vision import VisionPreset

NORM_EPS = 1e-6  # Qwen2.5-VL's vision RMSNorm
ROPE_THETA = 10000.0


@dataclass(frozen=True, slots=True)
class Segments:
    """Tokens that attend to each other (cu_seqlens' segments), padded to one length.

    `gather` [segments, max_len] picks each padded slot's token (padding reads token 0),
    `key_mask` [segments, 1, 1, max_len] hides padded keys (None when no segment is short),
    `scatter` [tokens] is each token's slot in the flattened [segments * max_len]. A single
    segment without padding needs neither index (gather is None)."""

    gather: torch.Tensor | None
    key_mask: torch.Tensor | None
    scatter: torch.Tensor | None


@dataclass(frozen=True, slots=True)
class VisionLayout:
    """What a patch grid fixes, as static tensors: the graph of that grid reads them in place."""

    grids: tuple[tuple[int, int], ...]  # (rows, columns) of patches per image
    num_patches: int
    window_index: torch.Tensor  # [patches / merge²] merge units in window order
    reverse_index: torch.Tensor  # [patches / merge²] back to raster order
    positions: torch.Tensor  # [patches] 0..n-1: row of cos_sin for each token
    cos_sin: torch.Tensor  # [patches, head_dim] float32: cos and sin halves, in window order
    full: Segments  # one segment an image (fullatt_block_indexes)
    windows: Segments  # one segment a window (the other blocks)


def vision_layout(
    grids: list[tuple[int, int]], preset: VisionPreset, device: torch.device | str = "cpu"
) -> VisionLayout:
    """The layout of a batch of images of the given patch grids (one temporal frame each)."""
    merge = preset.spatial_merge_size
    for rows, cols in grids:
        if rows % merge or cols % merge:
            raise ValueError(f"grid {rows}x{cols} is not a multiple of the {merge}x{merge} merge")
    window_index, window_lens = _window_order(grids, preset)
    rotary = torch.cat([_rotary_angles(r, c, preset) for r, c in grids])  # [patches, hd / 2]
    units = merge * merge
    rotary = rotary.reshape(-1, units, rotary.shape[-1])[window_index].reshape(rotary.shape)
    num_patches = sum(r * c for r, c in grids)
    return VisionLayout(
        grids=tuple(grids),
        num_patches=num_patches,
        window_index=window_index.to(device),
        reverse_index=torch.argsort(window_index).to(device),
        positions=torch.arange(num_patches, device=device),
        cos_sin=torch.cat([rotary.cos(), rotary.sin()], dim=-1).to(device),
        full=_segments([r * c for r, c in grids], device),
        windows=_segments(window_lens, device),
    )


def _rotary_angles(rows: int, cols: int, preset: VisionPreset) -> torch.Tensor:
    """[rows * cols, head_dim / 2]: a quarter of the head rotates by the row, a quarter by the
    column; tokens listed merge unit by merge unit, as the merger groups them."""
    merge = preset.spatial_merge_size
    dim = preset.hidden_size // preset.num_heads // 2
    inv_freq = 1.0 / ROPE_THETA ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    table = torch.outer(torch.arange(max(rows, cols), dtype=torch.float32), inv_freq)

    def by_unit(ids: torch.Tensor) -> torch.Tensor:
        return ids.reshape(rows // merge, merge, cols // merge, merge).permute(0, 2, 1, 3).flatten()

    row_ids = by_unit(torch.arange(rows).unsqueeze(1).expand(rows, cols))
    col_ids = by_unit(torch.arange(cols).unsqueeze(0).expand(rows, cols))
    return torch.cat([table[row_ids], table[col_ids]], dim=-1)


def _window_order(
    grids: list[tuple[int, int]], preset: VisionPreset
) -> tuple[torch.Tensor, list[int]]:
    """Merge units in window order, and each window's length in patches (Qwen2.5-VL's
    get_window_index: windows of window_size pixels a side, the last row and column short)."""
    merge = preset.spatial_merge_size
    side = preset.window_size // merge // preset.patch_size  # merge units a window side
    order, lens, offset = [], [], 0
    for rows, cols in grids:
        h, w = rows // merge, cols // merge
        index = torch.arange(h * w).reshape(h, w)
        pad_h, pad_w = -h % side, -w % side
        padded = F.pad(index, (0, pad_w, 0, pad_h), value=-1)
        tiles = padded.reshape((h + pad_h) // side, side, (w + pad_w) // side, side)
        tiles = tiles.permute(0, 2, 1, 3).reshape(-1, side * side)  # [windows, side²]
        for tile in tiles:
            kept = tile[tile >= 0]
            order.append(kept + offset)
            lens.append(len(kept) * merge * merge)
        offset += h * w
    return torch.cat(order), lens


def _segments(lens: list[int], device: torch.device | str) -> Segments:
    if len(lens) == 1:
        return Segments(None, None, None)
    width = max(lens)
    starts = torch.tensor([0, *lens[:-1]]).cumsum(0)
    length = torch.tensor(lens)
    slot = torch.arange(width)
    valid = slot.unsqueeze(0) < length.unsqueeze(1)  # [segments, width]
    gather = torch.where(valid, starts.unsqueeze(1) + slot, 0)
    scatter = torch.nonzero(valid.flatten()).flatten()  # valid slots, in token order
    key_mask = None if bool(valid.all()) else valid[:, None, None, :].to(device)
    return Segments(gather.to(device), key_mask, scatter.to(device))


class VisionAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=True)
        self.proj = nn.Linear(dim, dim, bias=True)

    def forward(self, x: torch.Tensor, layout: VisionLayout, segments: Segments) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(x).reshape(n, 3, self.num_heads, -1).unbind(1)  # [n, heads, hd]
        q, k = apply_rope(q, k, layout.positions, layout.cos_sin)
        out = _segment_attention(q, k, v.contiguous(), segments)  # [n, heads, hd]
        return self.proj(out.reshape(n, -1))


def _segment_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments: Segments
) -> torch.Tensor:
    """Attention inside each segment only: the segments, padded to one length, are a batch."""
    if segments.gather is None or segments.scatter is None:
        # 4-D, as SDPA's fused kernels need: a 3-D call takes the math path, which holds the
        # whole [heads, n, n] score matrix (2.5 GiB in bf16 at 9216 patches).
        q4, k4, v4 = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        return F.scaled_dot_product_attention(q4, k4, v4)[0].transpose(0, 1)
    qp, kp, vp = (t[segments.gather].transpose(1, 2) for t in (q, k, v))  # [seg, heads, len, hd]
    out = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=segments.key_mask)
    out = out.transpose(1, 2).flatten(0, 1)  # [seg * len, heads, hd]
    return out.index_select(0, segments.scatter)


class VisionMLP(nn.Module):
    """SwiGLU with biases; gate and up in one GEMM, as the language model's MLP."""

    def __init__(self, dim: int, intermediate: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(dim, 2 * intermediate, bias=True)
        self.down_proj = nn.Linear(intermediate, dim, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))


class VisionBlock(nn.Module):
    def __init__(self, preset: VisionPreset) -> None:
        super().__init__()
        dim = preset.hidden_size
        self.norm1 = nn.Parameter(torch.ones(dim))
        self.norm2 = nn.Parameter(torch.ones(dim))
        self.attn = VisionAttention(dim, preset.num_heads)
        self.mlp = VisionMLP(dim, preset.intermediate_size)

    def forward(self, x: torch.Tensor, layout: VisionLayout, segments: Segments) -> torch.Tensor:
        x = x + self.attn(rms_norm(x, self.norm1, NORM_EPS), layout, segments)
        return x + self.mlp(rms_norm(x, self.norm2, NORM_EPS))


class PatchMerger(nn.Module):
    """Each merge unit's merge² patches, concatenated, through an MLP to the LM's width."""

    def __init__(self, preset: VisionPreset) -> None:
        super().__init__()
        self.unit_dim = preset.hidden_size * preset.spatial_merge_size**2
        self.norm = nn.Parameter(torch.ones(preset.hidden_size))
        self.fc1 = nn.Linear(self.unit_dim, self.unit_dim, bias=True)
        self.fc2 = nn.Linear(self.unit_dim, preset.out_hidden_size, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = rms_norm(x, self.norm, NORM_EPS).reshape(-1, self.unit_dim)
        return self.fc2(F.gelu(self.fc1(x)))


class VisionTower(nn.Module):
    def __init__(self, preset: VisionPreset) -> None:
        super().__init__()
        self.preset = preset
        self.patch_dim = preset.in_channels * preset.temporal_patch_size * preset.patch_size**2
        # Qwen2.5-VL's Conv3d has kernel = stride = the patch: a linear over flattened patches.
        self.patch_embed = nn.Linear(self.patch_dim, preset.hidden_size, bias=False)
        self.blocks = nn.ModuleList(VisionBlock(preset) for _ in range(preset.depth))
        self.merger = PatchMerger(preset)

    def embed(self, patches: torch.Tensor, layout: VisionLayout) -> torch.Tensor:
        """[patches, patch_dim] pixels to [patches, hidden] in window order: the blocks' input."""
        x = self.patch_embed(patches)
        units = self.preset.spatial_merge_size**2
        return x.reshape(-1, units, x.shape[-1])[layout.window_index].reshape(x.shape)

    def encode(self, x: torch.Tensor, layout: VisionLayout) -> torch.Tensor:
        """The blocks and the merger, what a ViT graph captures: [patches / merge², out_hidden]
        in window order."""
        full = set(self.preset.fullatt_block_indexes)
        for i, block in enumerate(self.blocks):
            x = block(x, layout, layout.full if i in full else layout.windows)
        return self.merger(x)

    def forward(self, patches: torch.Tensor, layout: VisionLayout) -> torch.Tensor:
        """[patches, patch_dim] to [patches / merge², out_hidden] in the images' raster order."""
        return self.encode(self.embed(patches, layout), layout)[layout.reverse_index]


def build_vision_tower(
    preset: VisionPreset, *, device: torch.device | str, dtype: torch.dtype, seed: int = 0
) -> VisionTower:
    """Random weights created on the device: shapes, not values, set memory and kernel time.
    Linear weights are drawn with a small spread so that 32 residual blocks stay finite."""
    torch.manual_seed(seed)
    with torch.device(device):
        tower = VisionTower(preset)
    for name, param in tower.named_parameters():
        if param.dim() == 2:
            nn.init.normal_(param, std=0.02)
        elif "bias" in name:
            nn.init.zeros_(param)
    return tower.to(dtype).eval().requires_grad_(False)
