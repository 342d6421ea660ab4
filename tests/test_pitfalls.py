"""Capture pitfalls get a named cause: the op that waits for the host, the input that moved."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from cgtool.runners.pitfalls import CapturePitfall, StaticInputs, _user_frame, is_capture_error


def test_a_replaced_static_buffer_is_named_with_the_remedy():
    ids, pos = torch.zeros(8, dtype=torch.int64), torch.zeros(8, dtype=torch.int64)
    inputs = StaticInputs(input_ids=ids, positions=pos)
    inputs.check(input_ids=ids, positions=pos)  # unchanged: no error
    ids[:4].copy_(torch.arange(4))  # writing into the buffer keeps its address
    inputs.check(input_ids=ids, positions=pos)
    with pytest.raises(CapturePitfall, match="static input 'positions' moved after capture") as info:
        inputs.check(input_ids=ids, positions=torch.zeros(8, dtype=torch.int64))
    assert "copy_" in str(info.value)


def test_capture_errors_are_told_from_other_runtime_errors():
    assert is_capture_error(RuntimeError("CUDA error: operation not permitted when stream is capturing"))
    assert is_capture_error(RuntimeError("CUDA error: cudaErrorStreamCaptureInvalidated"))
    assert not is_capture_error(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_capture_error(ValueError("stream is capturing"))


def _offending_op(x: torch.Tensor) -> float:
    return x.sum().item()  # the line the diagnosis must name


def test_the_innermost_frame_outside_torch_is_named():
    try:
        _offending_op(torch.ones(2))
        raise RuntimeError("synchronizing op")  # stands in for the sync-debug error
    except RuntimeError as error:
        where = _user_frame(error)
    assert where.startswith("test_pitfalls.py:")
    assert "synchronizing op" in where


@pytest.fixture(scope="module")
def tiny_bench():
    from cgtool.capture.workbench import build_workbench
    from cgtool.specs.config import load_model_config

    return build_workbench(
        load_model_config("tiny"), weights_dir=None, dtype=torch.bfloat16, mem_fraction_static=0.5,
        max_bs=4, max_tokens=64, context_len=32, seed=0, kv_tokens=2048,
    )


@pytest.mark.gpu
def test_replay_refuses_a_buffer_replaced_after_capture(tiny_bench):
    from cgtool.runners.decode import DecodeGraphRunner

    runner = DecodeGraphRunner(tiny_bench.runner, [1, 2])
    runner.capture()
    batch = tiny_bench.decode_batch(2)
    runner.replay(batch)  # fine as captured
    runner.seq_lens = runner.seq_lens.clone()  # a new tensor: the graphs still read the old one
    with pytest.raises(CapturePitfall, match="static input 'seq_lens' moved after capture"):
        runner.replay(batch)


_SYNC_SCRIPT = """
import torch
from cgtool.capture.options import CaptureOptions, SessionState
from cgtool.capture.per_size import capture_each_size
from cgtool.specs.config import load_model_config
from cgtool.runners.decode import DecodeGraphRunner
from cgtool.runners.pitfalls import CapturePitfall
from cgtool.capture.workbench import build_workbench

bench = build_workbench(
    load_model_config("tiny"), weights_dir=None, dtype=torch.bfloat16, mem_fraction_static=0.5,
    max_bs=4, max_tokens=64, context_len=32, seed=0, kv_tokens=2048,
)
runner = DecodeGraphRunner(bench.runner, [1, 2])
layer = bench.runner.model.model.layers[0]
plain = layer.forward

def syncing_forward(positions, hidden, residual):
    if hidden.sum().item() > 1e30:  # a host read of a GPU value: not capturable
        pass
    return plain(positions, hidden, residual)

layer.forward = syncing_forward
try:
    opts = CaptureOptions(model="tiny", kinds=("decode",), capture_bs=[1, 2], capture_num_tokens=[])
    capture_each_size("decode", runner, runner.capture_bs, None, lambda *a: None, SessionState(), opts)
except CapturePitfall as pitfall:
    print("PITFALL", pitfall)
"""


@pytest.mark.gpu
def test_a_host_sync_inside_the_captured_forward_is_named(tmp_path):
    # In its own process: an aborted capture leaves the allocator and the CUDA RNG marked as
    # capturing, so nothing else may capture after it (the command itself stops there).
    script = tmp_path / "sync_in_forward.py"
    script.write_text(_SYNC_SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          check=False)
    message = next((l for l in done.stdout.splitlines() if l.startswith("PITFALL ")), done.stdout + done.stderr)
    assert message.startswith("PITFALL decode size 2: the captured forward waits for the host at sync_in_forward.py:"), message
    assert "hidden.sum().item()" in message


def test_the_drivers_out_of_memory_counts_as_out_of_memory_and_other_cuda_errors_do_not():
    # Instantiating a graph reports a full device as torch.AcceleratorError, not OutOfMemoryError.
    from cgtool.runners.pitfalls import is_out_of_memory

    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB"))
    assert is_out_of_memory(torch.AcceleratorError("CUDA error: out of memory\nSearch for ..."))
    assert not is_out_of_memory(torch.AcceleratorError("CUDA error: an illegal memory access was encountered"))
    assert not is_out_of_memory(RuntimeError("operation not permitted when stream is capturing"))
    assert not is_out_of_memory(ValueError("CUDA error: out of memory"))
