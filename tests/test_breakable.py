import random

import pytest
import torch
from replay_check import assert_replay_equals_eager
from test_piecewise import _mixed_batch, _model_runner

from cgtool.runners.breakable import BreakableGraphRunner, BreakingBackend, SegmentRecorder
from cgtool.runtime.batch import forward_context


class LoggedSegment:
    """A stand-in for a CUDA graph segment: it logs what the recorder and replay do to it."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.index = sum(1 for entry in log if entry.startswith("begin"))

    def begin(self) -> None:
        self.log.append(f"begin {self.index}")

    def end(self) -> None:
        self.log.append(f"end {self.index}")

    def replay(self) -> None:
        self.log.append(f"replay {self.index}")


def _record_tiny(model_runner, num_tokens):
    """One recording pass of the tiny model on the CPU with logged segments."""
    log: list[str] = []
    recorder = SegmentRecorder(lambda: LoggedSegment(log))
    runner = BreakableGraphRunner(model_runner, capture_num_tokens=[num_tokens])
    batch = runner.static_batch(num_tokens)
    breaking = BreakingBackend(model_runner.backend, recorder)
    recorder.start()
    with forward_context(batch, model_runner.kv_pool, breaking):
        hidden = model_runner.model.model(batch.input_ids, batch.positions)
    return recorder.finish(hidden), log, runner, batch


@pytest.fixture(scope="module")
def cpu_model_runner():
    return _model_runner("cpu", torch.float32, "torch", max_context_len=512)


def test_each_attention_call_ends_a_segment_and_starts_the_next(cpu_model_runner):
    graph, log, _, _ = _record_tiny(cpu_model_runner, 16)
    layers = cpu_model_runner.model.cfg.num_layers
    assert len(graph.segments) == layers + 1 and len(graph.breaks) == layers
    assert [b.layer_id for b in graph.breaks] == list(range(layers))
    expected = ["begin 0"]
    for i in range(layers):
        expected += [f"end {i}", f"begin {i + 1}"]
    assert log == expected + [f"end {layers}"]


def test_replay_alternates_segments_and_eager_attention_in_capture_order(cpu_model_runner):
    graph, log, _, _ = _record_tiny(cpu_model_runner, 16)
    log.clear()
    graph.replay(lambda b: log.append(f"attention {b.layer_id}"))
    layers = cpu_model_runner.model.cfg.num_layers
    expected = []
    for i in range(layers):
        expected += [f"replay {i}", f"attention {i}"]
    assert log == expected + [f"replay {layers}"]


def test_a_recording_pass_computes_what_the_eager_body_computes(cpu_model_runner):
    # The breaks run the real backend at once, so cutting the forward changes no value.
    graph, _, _runner, batch = _record_tiny(cpu_model_runner, 24)
    with forward_context(batch, cpu_model_runner.kv_pool, cpu_model_runner.backend):
        eager = cpu_model_runner.model.model(batch.input_ids, batch.positions)
    torch.testing.assert_close(graph.output, eager, rtol=0, atol=0)


def test_breaks_hold_the_buffers_attention_reads_and_writes(cpu_model_runner):
    graph, _, _, _ = _record_tiny(cpu_model_runner, 8)
    q_size = cpu_model_runner.model.cfg.q_size
    assert all(b.q.shape == b.out.shape == (8, q_size) for b in graph.breaks)


def test_closing_without_an_open_segment_is_an_error():
    recorder = SegmentRecorder(lambda: LoggedSegment([]))
    with pytest.raises(RuntimeError, match="no segment is open"):
        recorder.finish(None)


def test_can_run_rules_match_the_piecewise_runner(cpu_model_runner):
    runner = BreakableGraphRunner(cpu_model_runner, capture_num_tokens=[16, 64])
    runner.captured_num_tokens = [16, 64]  # as if captured: can_run reads only the list
    batch = _mixed_batch(cpu_model_runner, 40, random.Random(1))
    assert runner.can_run(batch)
    assert not runner.can_run(_mixed_batch(cpu_model_runner, 65, random.Random(2)))
    runner.drop_size(64)
    assert not runner.can_run(batch)


# ---------------------------------------------------------------- GPU

GPU_SIZES = [4, 16, 48, 128, 256, 512]


@pytest.fixture(scope="module")
def gpu_runner():
    model_runner = _model_runner("cuda", torch.bfloat16, "triton", num_slots=65536)
    runner = BreakableGraphRunner(model_runner, capture_num_tokens=GPU_SIZES)
    runner.capture()
    return runner


@pytest.mark.gpu
def test_every_size_has_one_segment_more_than_layers(gpu_runner):
    layers = gpu_runner.model_runner.model.cfg.num_layers
    assert gpu_runner.captured_num_tokens == GPU_SIZES
    assert all(gpu_runner.num_segments(n) == layers + 1 for n in GPU_SIZES)


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [4, 21, 48, 300, 512])
def test_breakable_replay_matches_eager_at_and_between_sizes(gpu_runner, num_tokens):
    batch = _mixed_batch(gpu_runner.model_runner, num_tokens, random.Random(num_tokens))
    assert gpu_runner.can_run(batch)
    count = gpu_runner.replay_count
    replayed = gpu_runner.forward(batch).clone()
    eager = gpu_runner.model_runner.forward_eager(batch)
    assert replayed.shape == eager.shape
    assert_replay_equals_eager(replayed, eager)
    assert gpu_runner.replay_count == count + 1


@pytest.mark.gpu
def test_breakable_eager_fallback_above_the_largest_size(gpu_runner):
    batch = _mixed_batch(gpu_runner.model_runner, 600, random.Random(3))
    count = gpu_runner.replay_count
    assert not gpu_runner.can_run(batch)
    assert gpu_runner.forward(batch).shape[0] == 600 and gpu_runner.replay_count == count


def test_a_breaking_backend_never_fuses_the_value_projection():
    # An MLA layer asks for attention and its value projection in one call (op.latent_attention);
    # while a size records, attention must stay a break, so the wrapper declines and never
    # reaches the backend it wraps.
    class Refusing:
        name = "inner"

        def forward_projected(self, *args):
            raise AssertionError("the wrapped backend was asked to fuse")

    recorder = SegmentRecorder(lambda: LoggedSegment([]))
    breaking = BreakingBackend(Refusing(), recorder)
    assert breaking.forward_projected(*[None] * 6) is False
    assert recorder.breaks == []
