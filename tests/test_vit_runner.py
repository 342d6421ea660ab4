"""VitGraphRunner's host-side rules on the CPU: buffers, keys, capture order, replay plumbing
(a stand-in graph runs the captured forward eagerly; real capture is in test_vit_gpu.py)."""

from __future__ import annotations

import gc

import pytest
import torch
from test_vit import TINY

from cgtool.model.vit import build_vision_tower
from cgtool.runners.vit import VitGraphRunner


class _EagerGraph:
    """Replays by running what capture would have recorded."""

    def __init__(self, runner: VitGraphRunner, patches: int) -> None:
        self.replay = lambda: runner.forward_static(patches)


def _runner(grids: list[tuple[int, int]]) -> VitGraphRunner:
    tower = build_vision_tower(TINY, device="cpu", dtype=torch.float32)
    return VitGraphRunner(tower, grids)


def test_static_buffers_are_sized_for_the_grid_with_most_patches() -> None:
    runner = _runner([(8, 8), (12, 16), (10, 14)])
    assert runner.capture_patches == [64, 140, 192]
    assert runner.block_input.shape == (192, TINY.hidden_size)
    assert runner.merged.shape == (48, TINY.out_hidden_size)
    assert runner.static_buffer_bytes > runner.block_input.nbytes + runner.merged.nbytes


def test_two_grids_with_one_patch_count_are_refused() -> None:
    with pytest.raises(ValueError, match="both have 192 patches"):
        _runner([(12, 16), (16, 12)])


def test_capture_records_every_grid_most_patches_first_with_gc_off(monkeypatch) -> None:
    runner = _runner([(8, 8), (12, 16), (10, 14)])
    recorded = []
    monkeypatch.setattr(runner, "_record", lambda n: recorded.append((n, gc.isenabled())))
    steps = []

    def step(index, size, record):
        steps.append((index, size))
        record()
        return True

    runner.capture(step)
    assert steps == [(0, 192), (1, 140), (2, 64)]
    assert recorded == [(192, False), (140, False), (64, False)]
    assert gc.isenabled()


def test_can_run_only_the_captured_grid_itself() -> None:
    runner = _runner([(12, 16), (8, 8)])
    assert not runner.can_run((12, 16))  # nothing captured yet
    runner.graphs = {192: _EagerGraph(runner, 192)}
    assert runner.can_run((12, 16))
    assert not runner.can_run((16, 12))  # same patch count, other windows
    assert not runner.can_run((8, 8)) and not runner.can_run((4, 4))


@pytest.mark.parametrize("grid", [(10, 14), (8, 8)])
def test_replay_path_returns_what_eager_returns_in_raster_order(grid) -> None:
    runner = _runner([(12, 16), (10, 14), (8, 8)])
    patches = grid[0] * grid[1]
    runner.graphs = {n: _EagerGraph(runner, n) for n in runner.capture_patches}
    pixels = torch.randn(patches, runner.tower.patch_dim, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        replayed = runner.forward(pixels, grid)
        expected = runner.eager(pixels, grid)
    assert runner.replay_count == 1
    assert replayed.shape == (patches // 4, TINY.out_hidden_size)
    torch.testing.assert_close(replayed, expected)


def test_uncaptured_grid_falls_back_to_eager() -> None:
    runner = _runner([(8, 8)])
    pixels = torch.randn(6 * 4, runner.tower.patch_dim)
    with torch.no_grad():
        out = runner.forward(pixels, (6, 4))
    assert out.shape == (6, TINY.out_hidden_size) and runner.replay_count == 0
