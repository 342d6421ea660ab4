"""gluon_mla's place beside triton_mla: where its stage 1 runs and where triton_mla's serves.

The kernel itself runs only on a Hopper GPU (tests/test_mla_gpu.py holds it to the torch
reference and to its own graph replays); tests/sm90_compile.py compiles it for sm_90 here.
"""

from __future__ import annotations

import pytest
import torch

from cgtool.attention import gluon_mla, triton_mla


def latent_shapes(rank: int, rope: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty(2, 16, rank + rope), torch.empty(2, 16, rank)


def test_not_available_on_the_cpu_nor_in_the_interpreter(monkeypatch):
    assert not gluon_mla.available(torch.device("cpu"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not gluon_mla.available(torch.device("cuda", 0))


@pytest.mark.parametrize(("rank", "rope", "fits"), [(512, 64, True), (256, 64, True), (512, 32, False),
                                                    (48, 16, False), (96, 64, False)])
def test_supports_only_parts_that_are_powers_of_two_of_a_copy_row_or_more(rank, rope, fits):
    assert gluon_mla.supports(rank, rope) is fits


def test_stage1_is_triton_mlas_where_gluon_does_not_run():
    q, out = latent_shapes(512, 64)
    assert triton_mla._stage1_buffers(q, out, None) == 0
    assert triton_mla._stage1_buffers(q, out, 3) == 0


def test_stage1_is_gluons_by_default_where_it_runs_unless_asked_otherwise(monkeypatch):
    monkeypatch.setattr(gluon_mla, "available", lambda device: True)
    q, out = latent_shapes(512, 64)
    assert triton_mla._stage1_buffers(q, out, None) == triton_mla.BUFFERED_TILES_COUNT == 2
    assert triton_mla._stage1_buffers(q, out, 3) == 3
    assert triton_mla._stage1_buffers(q, out, 0) == 0  # benchmarks and the stamps ask for triton_mla's
    q, out = latent_shapes(48, 16)
    assert triton_mla._stage1_buffers(q, out, None) == 0


def test_the_merge_kernel_paths_least_chunk_is_whole_tiles():
    block_n = triton_mla.BUFFERED_TILES[0]
    assert triton_mla.BUFFERED_MERGE_KERNEL_MIN_CHUNK % block_n == 0
    assert triton_mla.FUSED_MIN_CHUNK % block_n == 0


@pytest.mark.parametrize(("buffers", "fused", "lanes", "columns"), [
    (0, True, 8, 128), (0, False, 64, 128), (2, True, 8, 512), (2, False, 16, 512), (2, False, 32, 256),
    (2, False, 64, 128)])
def test_the_merge_takes_the_whole_latent_after_gluon_unless_its_lanes_would_spill(buffers, fused, lanes, columns):
    assert triton_mla._merge_slice(buffers, fused, lanes) == columns
    assert lanes * columns <= triton_mla.MERGE_TILE_VALUES or fused
