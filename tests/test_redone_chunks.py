"""The count of MLA decode chunks stage 1 did twice: its counter, its launch and its row.

The kernel's own counting (a chunk redone adds one, a chunk in range adds none) runs on the
GPU: tests/test_mla_gpu.py::test_wgmma_fixed_maximum_redoes_a_chunk_whose_scores_leave_its_range.
"""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from test_gluon_mla import _RecordingKernel
from test_gluon_mla_wgmma import _decode_on_cpu

from cgtool.attention import gluon_mla, gluon_mla_wgmma, redone_chunks
from cgtool.capture import kinds


def test_one_counter_a_device_made_at_zero_reset_and_read():
    counter = redone_chunks.counter("cpu")
    assert redone_chunks.counter(torch.device("cpu")) is counter  # a graph keeps its address
    assert counter.dtype == torch.int32 and counter.shape == (1,)
    counter += 5
    assert redone_chunks.read("cpu") == 5
    redone_chunks.reset("cpu")
    assert redone_chunks.counter("cpu") is counter and redone_chunks.read("cpu") == 0


def test_stage1_is_launched_with_the_devices_counter(monkeypatch):
    kernel = _RecordingKernel()
    monkeypatch.setattr(gluon_mla, "available", lambda device: True)
    monkeypatch.setattr(gluon_mla_wgmma, "_mla_decode_stage1_wgmma", kernel)
    _decode_on_cpu(20)
    (launch,) = kernel.launches
    assert launch["Redone"] is redone_chunks.counter("cpu")
    assert launch["FIXED_MAX"] is gluon_mla_wgmma.FIXED_MAX and launch["COUNT_REDONE"] is True


def test_counts_redone_where_the_fixed_maximum_serves(monkeypatch):
    cpu = torch.device("cpu")
    assert not gluon_mla_wgmma.counts_redone(cpu)  # no Hopper GPU: no kernel counts
    monkeypatch.setattr(gluon_mla, "available", lambda device: True)
    assert gluon_mla_wgmma.counts_redone(cpu) is bool(gluon_mla_wgmma.FIXED_MAX)
    monkeypatch.setattr(gluon_mla_wgmma, "COUNT_REDONE", False)  # a benchmark's setting
    assert not gluon_mla_wgmma.counts_redone(cpu)
    monkeypatch.setattr(gluon_mla_wgmma, "COUNT_REDONE", True)
    monkeypatch.setattr(gluon_mla_wgmma, "FIXED_MAX", False)
    assert not gluon_mla_wgmma.counts_redone(cpu)


@pytest.mark.parametrize(("value", "fixed"), [(None, True), ("1", True), ("0", False)])
def test_the_environment_turns_the_fixed_maximum_off(value, fixed):
    env = {k: v for k, v in os.environ.items() if k != "CGTOOL_MLA_FIXED_MAX"}
    if value is not None:
        env["CGTOOL_MLA_FIXED_MAX"] = value
    code = "from cgtool.attention import gluon_mla_wgmma as m; print(m.FIXED_MAX)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(fixed)


def _bench(latent: bool) -> SimpleNamespace:
    return SimpleNamespace(runner=SimpleNamespace(device=torch.device("cpu"),
                                                  kv_pool=SimpleNamespace(is_latent=latent)))


def test_a_decode_row_counts_the_chunks_one_replay_redid(monkeypatch):
    monkeypatch.setattr(gluon_mla_wgmma, "counts_redone", lambda device: True)
    redone_chunks.counter("cpu").fill_(40)  # left from earlier calls: reset before the replay

    def replay() -> None:
        redone_chunks.counter("cpu").add_(3)

    assert kinds._chunks_redone(_bench(latent=True), replay) == 3
    assert kinds._chunks_redone(_bench(latent=False), replay) is None  # not an MLA model
    monkeypatch.setattr(gluon_mla_wgmma, "counts_redone", lambda device: False)
    assert kinds._chunks_redone(_bench(latent=True), replay) is None  # nothing counts them
