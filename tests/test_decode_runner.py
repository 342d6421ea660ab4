import gc

import pytest
import torch
from replay_check import assert_replay_equals_eager

from cgtool.batch import ForwardMode
from cgtool.config import load_model_config
from cgtool.runners.decode import DecodeGraphRunner


class _FakeModelRunner:
    """Enough of ModelRunner for the runner's host-side rules, without a GPU."""

    def __init__(self):
        self.model = type("M", (), {"cfg": load_model_config("tiny")})()
        self.device = torch.device("cpu")


def _batch(bs, mode=ForwardMode.DECODE):
    return type("B", (), {"forward_mode": mode, "batch_size": bs})()


def test_static_buffers_sized_for_max_bs_with_dummy_padding():
    runner = DecodeGraphRunner(_FakeModelRunner(), [8, 1, 4, 2, 4])
    assert runner.capture_bs == [1, 2, 4, 8]
    assert runner.logits.shape == (8, 512)
    assert runner.seq_lens.tolist() == [1] * 8  # seq_len_fill_value
    assert runner.out_cache_loc.tolist() == [0] * 8 and runner.req_pool_indices.tolist() == [0] * 8


def test_can_run_only_decode_batches_within_captured_sizes():
    runner = DecodeGraphRunner(_FakeModelRunner(), [1, 2, 4])
    assert not runner.can_run(_batch(1))  # nothing captured yet
    runner.graphs = {1: object(), 2: object(), 4: object()}
    assert runner.can_run(_batch(3)) and runner.can_run(_batch(4))
    assert not runner.can_run(_batch(5))
    assert not runner.can_run(_batch(2, ForwardMode.EXTEND))


def test_capture_records_every_size_largest_first_with_gc_off(monkeypatch):
    runner = DecodeGraphRunner(_FakeModelRunner(), [1, 4, 2])
    recorded, steps = [], []
    monkeypatch.setattr(runner, "_record", lambda bs: recorded.append((bs, gc.isenabled())))

    def step(index, bs, record):
        steps.append((index, bs))
        record()
        return True

    runner.capture(step)
    assert steps == [(0, 4), (1, 2), (2, 1)]
    assert recorded == [(4, False), (2, False), (1, False)]
    assert gc.isenabled()


def test_enable_cudagraph_gc_records_with_the_collector_on(monkeypatch):
    runner = DecodeGraphRunner(_FakeModelRunner(), [1, 2], enable_cudagraph_gc=True)
    recorded = []
    monkeypatch.setattr(runner, "_record", lambda bs: recorded.append(gc.isenabled()))
    runner.capture()
    assert recorded == [True, True]


@pytest.fixture(scope="module")
def gpu_bench():
    from cgtool.capture.workbench import build_workbench

    cfg = load_model_config("qwen2.5-0.5b")
    return build_workbench(
        cfg, weights_dir=None, dtype=torch.bfloat16, mem_fraction_static=0.5,
        max_bs=16, max_tokens=64, context_len=300, seed=0, kv_tokens=8192,
    )


@pytest.mark.gpu
def test_replay_pads_to_next_captured_size_and_equals_eager(gpu_bench):
    runner = DecodeGraphRunner(gpu_bench.runner, [1, 2, 4, 8, 16])
    runner.capture()
    model = gpu_bench.runner.model
    for bs in (1, 3, 5, 8, 13, 16):
        batch = gpu_bench.decode_batch(bs)
        eager = model.compute_logits(gpu_bench.runner.forward_eager(batch))
        before = runner.replay_count
        replayed = runner.replay(batch).clone()
        assert runner.replay_count == before + 1
        assert replayed.shape == (bs, model.cfg.vocab_size)
        assert_replay_equals_eager(replayed, eager)


@pytest.mark.gpu
def test_replay_follows_new_inputs_not_the_captured_ones(gpu_bench):
    runner = DecodeGraphRunner(gpu_bench.runner, [4])
    runner.capture()
    a, b = gpu_bench.decode_batch(4), gpu_bench.decode_batch(4)
    b.input_ids = (a.input_ids + 1) % gpu_bench.cfg.vocab_size
    out_a = runner.replay(a).clone()
    out_b = runner.replay(b).clone()
    assert not torch.equal(out_a, out_b)
    eager_b = gpu_bench.runner.model.compute_logits(gpu_bench.runner.forward_eager(b))
    assert_replay_equals_eager(out_b, eager_b)
