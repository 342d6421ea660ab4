"""ViT capture shapes for a trace's images: the patch counts worth a graph, and SGLang's switch.

Each image becomes the patch count its processor resizes it to (cgtool.specs.vision); a count gets a
graph when it serves at least the share of images a token bin must serve of extend steps
(MIN_BIN_SHARE), since each graph keeps its own memory in the pool (seed 001).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from cgtool.documents.plan_document import VitPlan
from cgtool.errors import InputError
from cgtool.planner.grid import MIN_BIN_SHARE
from cgtool.specs.vision import (
    DEFAULT_VISION_PRESET,
    SGLANG_VIT_GRAPH_ENV,
    load_vision_preset,
    snap_image,
    vit_capture_shapes,
)


def vit_plan(
    requests_images: Iterable[Iterable[tuple[int, int]]] | None,
    preset_name: str = DEFAULT_VISION_PRESET,
) -> VitPlan | None:
    """The ViT part of a plan from each request's (height, width) images; None without any."""
    pairs_by_request = () if requests_images is None else requests_images  # may be an array
    images = [tuple(pair) for pairs in pairs_by_request for pair in pairs]
    if not images:
        return None
    preset = load_vision_preset(preset_name)
    shapes = vit_capture_shapes(images, preset, MIN_BIN_SHARE)  # type: ignore[arg-type]
    commonest: dict[int, Counter[tuple[int, int]]] = {}
    for height, width in images:
        try:
            snapped = snap_image(height, width, preset)
        except InputError:  # refused: counted by vit_capture_shapes
            continue
        count = snapped[0] * snapped[1] // preset.patch_size**2
        commonest.setdefault(count, Counter())[snapped] += 1
    served = sum(shapes.histogram[p] for p in shapes.recommended)
    return VitPlan(
        preset=preset.name,
        env=SGLANG_VIT_GRAPH_ENV,
        num_images=len(images),
        refused_images=shapes.refused,
        capture_patches=list(shapes.recommended),
        image_sizes=[list(commonest[p].most_common(1)[0][0]) for p in shapes.recommended],
        coverage=served / len(images),
        min_share=MIN_BIN_SHARE,
    )
