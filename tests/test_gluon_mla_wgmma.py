"""gluon_mla_wgmma's place in MLA decode: which batches its stage 1 serves, how it is launched,
and what serves where this Triton refuses it.

The kernel runs only on a Hopper GPU (tests/test_mla_gpu.py holds it to the torch reference and
to its graph replays); tests/sm90_compile.py compiles it for sm_90 here.
"""

from __future__ import annotations

import pytest
import torch
from test_gluon_mla import _RecordingKernel, _RefusingKernel

from cgtool.attention import gluon_mla, gluon_mla_wgmma, triton_mla


@pytest.mark.parametrize(("bs", "heads", "serves"), [
    (1, 16, False), (16, 16, False), (17, 16, True), (48, 16, True), (132, 16, True), (133, 16, False),
    (256, 16, False), (32, 20, False), (32, 128, False)])
def test_it_serves_one_head_blocks_batches_from_17_to_132(bs, heads, serves):
    assert triton_mla.wgmma_serves(bs, heads) is serves


def test_its_least_chunks_are_whole_tiles():
    assert triton_mla.WGMMA_MIN_CHUNK % gluon_mla_wgmma.WGMMA_TILES[0] == 0


def _decode_on_cpu(bs: int, **kwargs) -> tuple[torch.Tensor, tuple]:
    from test_triton_mla import latent_pool, latent_q

    seq_lens = [5 + 37 * i for i in range(bs)]
    pool, rows = latent_pool(seq_lens, 16, 512, 64, torch.float32, "cpu")
    q = latent_q(bs, 16, 576, torch.float32, "cpu").view(bs, 16, 576)
    args = (pool.k_buffers[0], pool.req_to_token, torch.tensor(rows, dtype=torch.int32),
            torch.tensor(seq_lens, dtype=torch.int32), 576**-0.5, triton_mla.mla_num_kv_splits(bs, 16))
    out = torch.full((bs, 16, 512), float("nan"))
    triton_mla.mla_decode_attention(q, args[0], out, *args[1:], **kwargs)
    return out, (q, args, pool, rows, seq_lens)


def test_it_is_launched_in_its_chunks_as_a_dependent_where_gluon_runs(monkeypatch):
    kernel = _RecordingKernel()
    monkeypatch.setattr(gluon_mla, "available", lambda device: True)
    monkeypatch.setattr(gluon_mla_wgmma, "_mla_decode_stage1_wgmma", kernel)
    monkeypatch.setattr(gluon_mla_wgmma, "dependent_launch", lambda device: {"PDL": True, "launch_pdl": True})
    _decode_on_cpu(20)
    (launch,) = kernel.launches
    # Flat: the kernel shares the batch's tiles among `programs` programs, as the plan says, and
    # reads no chunk cap (one value, so one compile for every batch size).
    assert launch["FLAT"] is True and launch["NUM_SPLITS"] == 1
    assert launch["programs"] == triton_mla.WGMMA_PROGRAMS == 132 and launch["BATCH_BLOCK"] == 128
    assert launch["FUSED_MERGE"] and launch["PDL"] and launch["launch_pdl"]
    assert launch["BLOCK_N"] == 64 and launch["num_warps"] == 4
    assert launch["MIN_CHUNK"] == triton_mla.WGMMA_MIN_CHUNK


def test_its_programs_are_flat_with_a_partial_slot_each_unless_the_grid_is_asked_for(monkeypatch):
    # FLAT_CHUNKS: WGMMA_PROGRAMS + bs programs, each finding its (request, chunk), the partials
    # in one row of that many slots; else the grid (bs, head blocks, chunks) and a row a request.
    kernel = _RecordingKernel()
    monkeypatch.setattr(gluon_mla, "available", lambda device: True)
    monkeypatch.setattr(gluon_mla_wgmma, "_mla_decode_stage1_wgmma", kernel)
    _decode_on_cpu(20)
    flat = kernel.launches[-1]
    assert gluon_mla_wgmma.FLAT_CHUNKS and flat["FLAT"] is True
    assert flat["grid"] == (triton_mla.WGMMA_PROGRAMS + 20, 1, 1)
    mid_out, mid_lse = flat["args"][2:4]
    assert mid_out.shape[:3] == (1, 16, 152) and mid_lse.shape == (1, 16, 152)
    monkeypatch.setattr(gluon_mla_wgmma, "FLAT_CHUNKS", False)
    _decode_on_cpu(20)
    grid = kernel.launches[-1]
    assert grid["FLAT"] is False and grid["grid"] == (20, 1, 13)
    assert grid["NUM_SPLITS"] == triton_mla.mla_num_kv_splits(20, 16) == 13  # at most the chunks asked for
    assert grid["args"][2].shape[:3] == (20, 16, 13)
    assert not gluon_mla_wgmma.flat_serves(20) and gluon_mla_wgmma.flat_serves(16) is False  # flag off


def test_it_takes_its_settings_at_each_launch_and_stamps_only_when_asked(monkeypatch):
    # benchmarks/probe_mla_timeline.py sets Q_FIRST and PARTIAL_VEC between launches and passes
    # `trace` with wgmma=True; as shipped the kernel is launched with stamps compiled out.
    kernel = _RecordingKernel()
    monkeypatch.setattr(gluon_mla, "available", lambda device: True)
    monkeypatch.setattr(gluon_mla_wgmma, "_mla_decode_stage1_wgmma", kernel)
    _decode_on_cpu(20)
    assert kernel.launches[-1]["TRACE"] is False
    assert gluon_mla_wgmma.Q_FIRST is None and kernel.launches[-1]["Q_FIRST"] is False  # by GPU: none here
    assert kernel.launches[-1]["PARTIAL_VEC"] == gluon_mla_wgmma.PARTIAL_VEC
    monkeypatch.setattr(gluon_mla_wgmma, "Q_FIRST", True)
    monkeypatch.setattr(gluon_mla_wgmma, "PARTIAL_VEC", 4)
    stamps = torch.zeros(20 * triton_mla.mla_num_kv_splits(20, 16), 8, dtype=torch.int64)
    _decode_on_cpu(20, trace=stamps, wgmma=True)
    assert kernel.launches[-1]["TRACE"] is True and kernel.launches[-1]["Trace"] is stamps
    assert kernel.launches[-1]["Q_FIRST"] is True and kernel.launches[-1]["PARTIAL_VEC"] == 4


@pytest.mark.parametrize(("name", "ahead"), [("NVIDIA H200", True), ("NVIDIA H100 80GB HBM3", False),
                                             ("NVIDIA H800", False)])
def test_q_is_loaded_ahead_by_default_on_the_h200_only(monkeypatch, name, ahead):
    # Q_FIRST None (as shipped) follows the GPU class: ahead measured shorter on the H200 with
    # the fixed maximum; the H100 measured it longer before and was not lent to time it since.
    from cgtool.runtime import gpu_class

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: name)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    gpu_class.device_name.cache_clear()
    try:
        assert gluon_mla_wgmma.q_first(torch.device("cuda")) is ahead
        assert gluon_mla_wgmma.q_first(torch.device("cuda", 1)) is ahead
        monkeypatch.setattr(gluon_mla_wgmma, "Q_FIRST", not ahead)  # a setting overrides the class
        assert gluon_mla_wgmma.q_first(torch.device("cuda")) is (not ahead)
    finally:
        gpu_class.device_name.cache_clear()
    assert gluon_mla_wgmma.q_first(torch.device("cpu")) is (not ahead)


class _RecordingLaunch:
    """Stands for a CachedKernel: keeps each launch's keyword arguments."""

    def __init__(self) -> None:
        self.launches: list[dict] = []

    def launch(self, grid, *args, **kwargs) -> None:
        self.launches.append(kwargs)


def test_stamps_without_wgmma_asked_for_are_triton_mlas(monkeypatch):
    # (The stamps' inline asm does not run in Triton's interpreter, so the launch is recorded.)
    wgmma, stage1 = _RecordingKernel(), _RecordingLaunch()
    monkeypatch.setattr(gluon_mla, "available", lambda device: True)
    monkeypatch.setattr(gluon_mla_wgmma, "_mla_decode_stage1_wgmma", wgmma)
    monkeypatch.setattr(triton_mla, "_MLA_STAGE1", stage1)
    monkeypatch.setattr(triton_mla, "_MLA_MERGE", _RecordingLaunch())
    _decode_on_cpu(20, trace=torch.zeros(20 * triton_mla.mla_num_kv_splits(20, 16), 8, dtype=torch.int64))
    assert not wgmma.launches and stage1.launches[0]["TRACE"] is True


def test_a_triton_that_refuses_it_gets_the_next_kernel_with_one_warning(monkeypatch):
    # Here both Gluon kernels are refused, so triton_mla's serves, at the chunks first asked for.
    from test_triton_decode import assert_attention_close
    from test_triton_mla import run_decode

    monkeypatch.setattr(gluon_mla, "_REFUSED", [])
    monkeypatch.setattr(gluon_mla_wgmma, "_REFUSED", [])
    monkeypatch.setattr(gluon_mla, "available", lambda device: not gluon_mla._REFUSED)
    monkeypatch.setattr(gluon_mla, "_mla_decode_stage1_buffered", _RefusingKernel())
    monkeypatch.setattr(gluon_mla_wgmma, "_mla_decode_stage1_wgmma", _RefusingKernel())
    with pytest.warns(RuntimeWarning, match="refused gluon_mla_wgmma"):
        fallen_back, (q, args, pool, rows, seq_lens) = _decode_on_cpu(17)
    assert gluon_mla_wgmma.refused()
    plain = torch.full_like(fallen_back, float("nan"))
    triton_mla.mla_decode_attention(q, args[0], plain, *args[1:], buffers=0)
    torch.testing.assert_close(fallen_back, plain, rtol=0, atol=0)
    _, ref = run_decode(pool, rows, seq_lens, 16)
    assert_attention_close(fallen_back.view(17, -1), ref, atol=2e-2)

