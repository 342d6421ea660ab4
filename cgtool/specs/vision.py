"""Vision encoders: their shapes, and how an image size becomes a patch count.

A vision tower's CUDA graph is keyed by its sequence length, the number of patches the image
becomes (SGLang's graph_key = S). The processor decides that number: it resizes each image so
both sides are multiples of patch_size × spatial_merge_size, keeping the pixel count between
min_pixels and max_pixels (Qwen2-VL's `smart_resize` in transformers). Torch-free.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from importlib import resources

from cgtool.errors import InputError

DEFAULT_VISION_PRESET = "qwen2.5-vl-7b"
# `cgtool capture --kind vit` without --image-sizes: a small and a large square, a wide
# image whose last windows are short (20x30 merge units in windows of 4x4), and 1344 px, a
# common upper bound on served image sides. Four grids, four patch counts.
DEFAULT_VIT_IMAGE_SIZES = "448x448,560x840,896x896,1344x1344"


@dataclass(frozen=True, slots=True)
class VisionPreset:
    """A vision tower's shapes (from `vision_config`) and its processor's resize limits."""

    name: str
    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    in_channels: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    window_size: int  # pixels; window attention covers window_size / patch_size patches a side
    fullatt_block_indexes: tuple[int, ...]
    out_hidden_size: int  # the merger's output width: the language model's hidden size
    min_pixels: int
    max_pixels: int
    max_aspect_ratio: int

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise InputError(
                f"vision preset {self.name}: hidden_size {self.hidden_size} is not a multiple "
                f"of num_heads {self.num_heads}",
                "Fix the preset.",
            )
        if any(not 0 <= i < self.depth for i in self.fullatt_block_indexes):
            raise InputError(
                f"vision preset {self.name}: fullatt_block_indexes lie outside 0..{self.depth - 1}",
                "Fix the preset.",
            )

    @property
    def factor(self) -> int:
        """Both sides of a resized image are multiples of this many pixels."""
        return self.patch_size * self.spatial_merge_size


def vision_preset_names() -> list[str]:
    folder = resources.files("cgtool") / "presets" / "vision"
    return sorted(p.name[: -len(".json")] for p in folder.iterdir() if p.name.endswith(".json"))


def load_vision_preset(name: str = DEFAULT_VISION_PRESET) -> VisionPreset:
    path = resources.files("cgtool") / "presets" / "vision" / f"{name}.json"
    if not path.is_file():
        raise InputError(f"unknown vision preset '{name}'", f"Use {DEFAULT_VISION_PRESET}.")
    data = json.loads(path.read_text())
    shapes, processor = data["vision_config"], data["processor"]
    return VisionPreset(
        name=name,
        fullatt_block_indexes=tuple(shapes["fullatt_block_indexes"]),
        **{k: v for k, v in shapes.items() if k != "fullatt_block_indexes"},
        **processor,
    )


def snap_image(height: int, width: int, preset: VisionPreset) -> tuple[int, int]:
    """The (height, width) the processor resizes an image to, as Qwen2-VL's smart_resize does."""
    if height < 1 or width < 1:
        raise InputError(f"image {height}x{width} has no pixels", "Sizes are whole pixels, >= 1.")
    if max(height, width) / min(height, width) > preset.max_aspect_ratio:
        raise InputError(
            f"image {height}x{width} is more than {preset.max_aspect_ratio} times longer than "
            "wide, which the processor refuses",
            "Crop or pad it first.",
        )
    factor = preset.factor
    # Python's round() halves to even, as the processor's does: 42 px snaps to 56, 14 px to 0.
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > preset.max_pixels:
        beta = math.sqrt(height * width / preset.max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < preset.min_pixels:
        beta = math.sqrt(preset.min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def patch_grid(height: int, width: int, preset: VisionPreset) -> tuple[int, int]:
    """Patches a side after resizing: the (rows, columns) the vision blocks see."""
    h_bar, w_bar = snap_image(height, width, preset)
    return h_bar // preset.patch_size, w_bar // preset.patch_size


def patch_count(height: int, width: int, preset: VisionPreset) -> int:
    """The vision blocks' sequence length for one image: the key its graph is captured under."""
    rows, columns = patch_grid(height, width, preset)
    return rows * columns


def merged_tokens(patches: int, preset: VisionPreset) -> int:
    """Tokens the merger hands the language model: one per spatial_merge_size² patches."""
    return patches // preset.spatial_merge_size**2


_SIZE = re.compile(r"\s*(\d+)\s*[xX]\s*(\d+)\s*")


def parse_image_sizes(
    text: str, preset: VisionPreset, flag: str = "--image-sizes"
) -> list[tuple[int, int]]:
    """`448x448,896x896` (height x width) as capture shapes the processor can produce."""
    sizes = []
    for item in text.split(","):
        match = _SIZE.fullmatch(item)
        if match is None:
            raise InputError(
                f"{flag} {item.strip()!r} is not HEIGHTxWIDTH",
                "Write sizes in pixels, such as --image-sizes 448x448,896x896.",
            )
        height, width = int(match[1]), int(match[2])
        if not (height and width):
            raise InputError(f"{flag} {height}x{width} has no pixels", "Sizes are >= 1 px a side.")
        snapped = snap_image(height, width, preset)
        if snapped != (height, width):
            raise InputError(
                f"{flag} {height}x{width} is not a size the {preset.name} processor produces "
                f"(multiples of {preset.factor} px within {preset.min_pixels:,}-"
                f"{preset.max_pixels:,} pixels; it would resize this image to "
                f"{snapped[0]}x{snapped[1]})",
                f"Write {snapped[0]}x{snapped[1]} instead.",
            )
        sizes.append((height, width))
    return sizes


def capture_grids(
    sizes: list[tuple[int, int]], preset: VisionPreset, flag: str = "--image-sizes"
) -> list[tuple[int, int]]:
    """Patch grids (rows, columns) of snapped image sizes, one per patch count: a ViT graph
    is keyed by its patch count, and one count with two grids would need two graphs."""
    grids: dict[int, tuple[int, int]] = {}
    sizes_by_count: dict[int, tuple[int, int]] = {}
    for height, width in sizes:
        grid = patch_grid(height, width, preset)
        count = grid[0] * grid[1]
        if count in grids and grids[count] != grid:
            first = sizes_by_count[count]
            raise InputError(
                f"{flag} {first[0]}x{first[1]} and {height}x{width} both give {count} patches "
                "in different grids, and a ViT graph is keyed by its patch count",
                "Keep one of the two.",
            )
        grids[count] = grid
        sizes_by_count.setdefault(count, (height, width))
    return list(grids.values())


# SGLang turns ViT graphs on with this environment variable (seed 001, "CUDA Graph for
# Vision Transformers"); graphs are then captured per patch count as images arrive.
SGLANG_VIT_GRAPH_ENV = "SGLANG_VIT_ENABLE_CUDA_GRAPH=1"


@dataclass(frozen=True, slots=True)
class VitShapes:
    """Images of a trace by patch count, and the counts worth a graph of their own."""

    histogram: dict[int, int]  # patches -> images, most frequent first
    recommended: tuple[int, ...]  # patch counts, most frequent first
    refused: int  # images the processor refuses (aspect ratio)


def vit_capture_shapes(
    images: list[tuple[int, int]], preset: VisionPreset, min_share: float
) -> VitShapes:
    """Patch counts of `images`, keeping those that serve at least `min_share` of them
    (the planner passes the token bins' MIN_BIN_SHARE, so rare sizes get no graph)."""
    counts: dict[int, int] = {}
    refused = 0
    for height, width in images:
        try:
            patches = patch_count(height, width, preset)
        except InputError:
            refused += 1
            continue
        counts[patches] = counts.get(patches, 0) + 1
    histogram = dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))
    total = sum(histogram.values())
    kept = tuple(p for p, n in histogram.items() if n >= min_share * total)
    return VitShapes(histogram, kept, refused)
