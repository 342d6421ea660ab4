import pytest

from cgtool.errors import InputError
from cgtool.specs.vision import (
    SGLANG_VIT_GRAPH_ENV,
    load_vision_preset,
    merged_tokens,
    parse_image_sizes,
    patch_count,
    patch_grid,
    snap_image,
    vit_capture_shapes,
)

QWEN = load_vision_preset("qwen2.5-vl-7b")


def test_preset_matches_the_public_qwen2_5_vl_7b_vision_config():
    assert (QWEN.patch_size, QWEN.hidden_size, QWEN.depth, QWEN.num_heads) == (14, 1280, 32, 16)
    assert QWEN.intermediate_size == 3420
    assert QWEN.window_size == 112
    assert QWEN.fullatt_block_indexes == (7, 15, 23, 31)
    assert (QWEN.spatial_merge_size, QWEN.out_hidden_size) == (2, 3584)
    assert QWEN.factor == 28


def test_unknown_vision_preset_is_an_input_error():
    with pytest.raises(InputError, match="unknown vision preset"):
        load_vision_preset("nope")


@pytest.mark.parametrize(
    ("size", "snapped"),
    [
        ((448, 448), (448, 448)),  # already on the grid
        ((450, 470), (448, 476)),  # each side to its nearest multiple of 28 (16.07, 16.79)
        ((42, 42), (56, 56)),  # 1.5 halves to even (2), as the processor's round() does
        ((10, 10), (56, 56)),  # too few pixels: scaled up to min_pixels, rounded up
        ((4000, 6000), (2912, 4368)),  # too many: scaled by 1/1.3669, each side rounded down
    ],
)
def test_snap_image_follows_smart_resize(size, snapped):
    assert snap_image(*size, QWEN) == snapped


def test_snapped_sizes_are_multiples_of_28_within_the_pixel_limits():
    for height in range(1, 3000, 97):
        for width in range(height, 6000, 389):
            if width / height > QWEN.max_aspect_ratio:
                continue
            h, w = snap_image(height, width, QWEN)
            assert h % 28 == 0 and w % 28 == 0
            assert QWEN.min_pixels <= h * w <= QWEN.max_pixels


def test_snap_image_refuses_an_aspect_ratio_the_processor_refuses():
    with pytest.raises(InputError, match="more than 200 times"):
        snap_image(10, 2010, QWEN)


def test_patch_grid_and_count_of_a_448_image():
    assert patch_grid(448, 448, QWEN) == (32, 32)
    assert patch_count(448, 448, QWEN) == 1024
    assert merged_tokens(1024, QWEN) == 256  # 2x2 patches merge into one token


def test_parse_image_sizes_reads_height_by_width_pairs():
    assert parse_image_sizes("448x448, 896X672", QWEN) == [(448, 448), (896, 672)]


@pytest.mark.parametrize("text", ["448", "448x", "axb", "448x448x3", "448*448", "-28x28", ""])
def test_parse_image_sizes_refuses_malformed_text_in_one_sentence(text):
    with pytest.raises(InputError, match="is not HEIGHTxWIDTH") as caught:
        parse_image_sizes(text, QWEN)
    assert "\n" not in str(caught.value)


def test_parse_image_sizes_refuses_a_size_the_processor_would_resize_and_names_the_fix():
    with pytest.raises(InputError, match="450x450 is not a size") as caught:
        parse_image_sizes("448x448,450x450", QWEN)
    assert "Write 448x448 instead" in str(caught.value)


def test_parse_image_sizes_refuses_a_grid_size_below_min_pixels():
    with pytest.raises(InputError, match="28x28 is not a size"):
        parse_image_sizes("28x28", QWEN)


def test_parse_image_sizes_refuses_zero_pixels():
    with pytest.raises(InputError, match="0x448 has no pixels"):
        parse_image_sizes("0x448", QWEN)


def test_vit_capture_shapes_counts_patches_and_drops_rare_shapes():
    images = [(448, 448)] * 6 + [(450, 450)] * 2 + [(896, 896)] * 3 + [(672, 448)] + [(5, 2000)]
    shapes = vit_capture_shapes(images, QWEN, min_share=0.2)
    # 450x450 snaps to 448x448: both are 1,024 patches.
    assert shapes.histogram == {1024: 8, 4096: 3, 1536: 1}
    assert shapes.recommended == (1024, 4096)  # 1536 serves 1 of 12 images, under 20%
    assert shapes.refused == 1  # 5x2000 is past the processor's 200:1 ratio


def test_vit_capture_shapes_of_no_images_recommends_nothing():
    assert vit_capture_shapes([], QWEN, min_share=0.005).recommended == ()


def test_the_sglang_switch_is_the_seed_documents_variable():
    assert SGLANG_VIT_GRAPH_ENV == "SGLANG_VIT_ENABLE_CUDA_GRAPH=1"


def test_default_vit_image_sizes_are_four_grids_the_processor_produces():
    from cgtool.specs.vision import DEFAULT_VIT_IMAGE_SIZES, capture_grids

    sizes = parse_image_sizes(DEFAULT_VIT_IMAGE_SIZES, QWEN)
    grids = capture_grids(sizes, QWEN)
    assert len(grids) == len(sizes) >= 4
    assert (40, 60) in grids  # 20x30 merge units: short windows at the edges


def test_capture_grids_are_the_patch_grids_once_each():
    from cgtool.specs.vision import capture_grids

    assert capture_grids([(448, 448), (448, 896), (448, 448)], QWEN) == [(32, 32), (32, 64)]


def test_two_sizes_with_one_patch_count_in_different_grids_are_refused():
    from cgtool.specs.vision import capture_grids

    with pytest.raises(InputError, match="448x896 and 896x448 both give 2048 patches"):
        capture_grids([(448, 896), (896, 448)], QWEN)
