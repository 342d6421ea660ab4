"""gluon_mla's place beside triton_mla: where its stage 1 runs and where triton_mla's serves.

The kernel itself runs only on a Hopper GPU (tests/test_mla_gpu.py holds it to the torch
reference and to its own graph replays); tests/sm90_compile.py compiles it for sm_90 here.
"""

from __future__ import annotations

import pytest
import torch
from triton.compiler.errors import CompilationError

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


class _RefusingKernel:
    """Stands for a Gluon kernel that this Triton's compiler refuses (a renamed builtin)."""

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            raise CompilationError("def _kernel(...)", None, "module 'gl' has no attribute 'thread_barrier'")

        return launch


def test_a_triton_that_refuses_the_kernel_gets_triton_mlas_with_one_warning(monkeypatch):
    from test_triton_decode import assert_attention_close
    from test_triton_mla import latent_pool, latent_q, run_decode

    monkeypatch.setattr(gluon_mla, "_REFUSED", [])
    monkeypatch.setattr(gluon_mla, "available", lambda device: not gluon_mla._REFUSED)
    monkeypatch.setattr(gluon_mla, "_mla_decode_stage1_buffered", _RefusingKernel())
    seq_lens = [5, 130, 64]
    pool, rows = latent_pool(seq_lens, 16, 512, 64, torch.float32, "cpu")
    q = latent_q(3, 16, 576, torch.float32, "cpu").view(3, 16, 576)
    args = (pool.k_buffers[0], pool.req_to_token, torch.tensor(rows, dtype=torch.int32),
            torch.tensor(seq_lens, dtype=torch.int32), 576**-0.5, 4)

    def decode(**kwargs) -> torch.Tensor:
        out = torch.full((3, 16, 512), float("nan"))
        triton_mla.mla_decode_attention(q, args[0], out, *args[1:], **kwargs)
        return out

    with pytest.warns(RuntimeWarning, match="refused gluon_mla"):
        fallen_back = decode()
    # triton_mla's kernel at its own settings (bf16 partials at 4 chunks): the same bits, and
    # the reference within bf16's rounding.
    torch.testing.assert_close(fallen_back, decode(buffers=0), rtol=0, atol=0)
    _, ref = run_decode(pool, rows, seq_lens, 16)
    assert_attention_close(fallen_back.view(3, -1), ref, atol=2e-2)
    assert gluon_mla._REFUSED == ["module 'gl' has no attribute 'thread_barrier'"]
    assert not gluon_mla.available(torch.device("cuda", 0))
    assert triton_mla._stage1_buffers(q, fallen_back, None) == 0  # no second try



class _RecordingKernel:
    """Stands for the Gluon kernel: keeps each launch's keyword arguments, with its grid and
    positional arguments under "grid" and "args"."""

    def __init__(self) -> None:
        self.launches: list[dict] = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append({**kwargs, "grid": grid, "args": args})


@pytest.mark.parametrize("dependent", [True, False])
def test_stage1_is_a_dependent_launch_where_they_run(monkeypatch, dependent):
    kernel = _RecordingKernel()
    monkeypatch.setattr(gluon_mla, "_mla_decode_stage1_buffered", kernel)
    monkeypatch.setattr(gluon_mla, "dependent_launch",
                        lambda device: {"PDL": True, "launch_pdl": True} if dependent else {"PDL": False})
    q, out = latent_shapes(512, 64)
    mid = torch.empty(2, 16, 4, 512)
    ints = torch.zeros(2, dtype=torch.int32)
    assert gluon_mla.launch_stage1(q, torch.empty(8, 1, 576), mid, mid[..., 0], out, ints, torch.zeros(3, 8),
                                   ints, ints, 1.0, 16, 4, 256, 32, 2, 4, 512)
    assert kernel.launches[0]["PDL"] is dependent
    # Merged in its last program (tickets) nothing follows it; without tickets the merge kernel,
    # its dependent, is released at its start where RELEASE_MERGE_AT_START says so.
    assert kernel.launches[0]["RELEASE"] is False
    assert gluon_mla.launch_stage1(q, torch.empty(8, 1, 576), mid, mid[..., 0], out, None, torch.zeros(3, 8),
                                   ints, ints, 1.0, 16, 4, 256, 32, 2, 4, 512)
    assert kernel.launches[1]["RELEASE"] is (dependent and gluon_mla.RELEASE_MERGE_AT_START)
    monkeypatch.setattr(gluon_mla, "RELEASE_MERGE_AT_START", True)
    assert gluon_mla.launch_stage1(q, torch.empty(8, 1, 576), mid, mid[..., 0], out, None, torch.zeros(3, 8),
                                   ints, ints, 1.0, 16, 4, 256, 32, 2, 4, 512)
    assert kernel.launches[2]["RELEASE"] is dependent
    assert kernel.launches[0].get("launch_pdl", False) is dependent
    assert kernel.launches[0]["CHAINS"] == gluon_mla.SCORE_CHAINS  # the last program merges (tickets)


@pytest.mark.parametrize(("rank", "fused", "chains"), [(512, True, 4), (512, False, 1), (128, True, 4),
                                                       (64, True, 1)])
def test_four_running_sums_of_scores_only_where_the_last_program_merges(rank, fused, chains):
    # Measured faster there and slower on the merge kernel's path; a rank of 64 holds no four
    # 32-wide slices.
    assert gluon_mla.score_chains(rank, fused) == min(chains, gluon_mla.SCORE_CHAINS)
