"""ViT graphs on the GPU: the Qwen2.5-VL-7B tower's grids captured in the shared pool, replay
equal to eager in bf16, and the CLI's report rows consistent."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from cgtool.capture.measure import compare_outputs
from cgtool.specs.vision import (
    DEFAULT_VIT_IMAGE_SIZES,
    capture_grids,
    load_vision_preset,
    parse_image_sizes,
)

pytestmark = pytest.mark.gpu
PRESET = load_vision_preset("qwen2.5-vl-7b")
GRIDS = capture_grids(parse_image_sizes(DEFAULT_VIT_IMAGE_SIZES, PRESET), PRESET)


@pytest.fixture(scope="module")
def runner():
    from cgtool.model.vit import build_vision_tower
    from cgtool.runners.vit import VitGraphRunner

    tower = build_vision_tower(PRESET, device="cuda", dtype=torch.bfloat16)
    vit = VitGraphRunner(tower, GRIDS)
    vit.capture()
    return vit


def _pixels(grid, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn((grid[0] * grid[1], 1176), generator=gen, device="cuda", dtype=torch.bfloat16)


def test_every_grid_is_captured_most_patches_first_into_one_pool(runner):
    assert len(GRIDS) >= 4
    assert runner.captured_patches == sorted(r * c for r, c in GRIDS)
    assert all(runner.can_run(grid) for grid in GRIDS)


@pytest.mark.parametrize("grid", GRIDS, ids=lambda g: f"{g[0]}x{g[1]}")
def test_replay_equals_eager_within_bf16_tolerance(runner, grid):
    for seed in (0, 1):  # a second image of the grid: the static input really is re-read
        pixels = _pixels(grid, seed)
        eager = [runner.eager(pixels, grid).float().clone()]
        replayed = [runner.replay(pixels, grid).float().clone()]
        assert replayed[0].shape == (grid[0] * grid[1] // 4, PRESET.out_hidden_size)
        assert torch.isfinite(replayed[0]).all()
        diff, tolerance, _, row = compare_outputs(eager, replayed, torch.bfloat16)
        assert diff <= tolerance, f"grid {grid} seed {seed}: token {row} differs by {diff:.3g}"


def test_capture_kind_vit_writes_consistent_memory_rows(tmp_path):
    from cgtool.commands.main import app
    from cgtool.documents.invariants import memory_violations
    from cgtool.documents.results import load_report

    out = tmp_path / "vit"
    result = CliRunner().invoke(app, ["capture", "--model", "qwen2.5-vl-7b", "--kind", "vit",
                                      "--image-sizes", DEFAULT_VIT_IMAGE_SIZES, "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    rows = report["sizes"]
    assert {row["kind"] for row in rows} == {"vit"}
    assert sorted(row["size"] for row in rows) == sorted(r * c for r, c in GRIDS)
    assert all(row["status"] == "ok" for row in rows)
    assert all(row["peak_bytes"] >= row["retained_bytes"] >= 0 for row in rows)
    assert all(row["eager_ms"] > 0 and row["replay_ms"] > 0 and row["kernels_per_forward"] > 0
               for row in rows)
    assert sum(row["retained_bytes"] for row in rows) == report["totals"]["graph_pool_bytes"]
    assert report["totals"]["kv_pool_bytes"] == 0 and report["totals"]["weights_bytes"] > 0
    assert memory_violations(load_report(out)) == []
