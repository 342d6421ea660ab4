import dataclasses
import gc

import pytest
import torch
from replay_check import assert_replay_equals_eager

from cgtool.runners.decode import DecodeGraphRunner
from cgtool.runtime.batch import ForwardMode
from cgtool.specs.config import load_model_config
from cgtool.specs.hidden_states import HiddenMode


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


HIDDEN = load_model_config("tiny").hidden_size


@pytest.mark.parametrize("mode, shape", [
    (HiddenMode.NULL, None), (HiddenMode.LAST, (8, HIDDEN)), (HiddenMode.FULL, (8, HIDDEN)),
])
def test_hidden_state_buffer_is_allocated_once_at_max_bs_for_its_mode(mode, shape):
    runner = DecodeGraphRunner(_FakeModelRunner(), [1, 2, 8], hidden_mode=mode)
    assert (None if runner.hidden_states is None else tuple(runner.hidden_states.shape)) == shape
    logits_bytes = runner.logits.numel() * 4
    inputs_bytes = 4 * 8 * 8 + 8 * 4  # four int64 inputs and the int32 seq_lens
    extra = 0 if shape is None else 8 * HIDDEN * runner.hidden_states.element_size()
    assert runner.static_buffer_bytes == logits_bytes + inputs_bytes + extra


def test_recapture_goes_upward_keeps_the_old_graphs_and_refuses_downgrades(monkeypatch):
    runner = DecodeGraphRunner(_FakeModelRunner(), [1, 2])
    monkeypatch.setattr(runner, "_record", lambda bs: runner.graphs.__setitem__(bs, f"{runner.hidden_mode.name}:{bs}"))
    runner.capture()
    runner.recapture(HiddenMode.FULL)
    assert runner.graphs == {2: "FULL:2", 1: "FULL:1"}
    assert runner.retired_graphs == ["NULL:2", "NULL:1"]  # alive: they share the pool
    assert runner.hidden_states.shape == (2, HIDDEN)
    with pytest.raises(ValueError, match="upward only"):
        runner.recapture(HiddenMode.LAST)


def _cpu_runner():
    from cgtool.attention import make_backend
    from cgtool.model.loader import build_model
    from cgtool.runtime.engine import ModelRunner
    from cgtool.runtime.kv import KVPool

    cfg = load_model_config("tiny")
    torch.manual_seed(0)
    model = build_model(cfg, device="cpu", dtype=torch.float32, max_positions=64)
    pool = KVPool(cfg, num_slots=512, max_reqs=8, max_context_len=64, dtype=torch.float32, device="cpu")
    return ModelRunner(model, pool, make_backend("torch", cfg.num_heads, cfg.head_dim))


@pytest.mark.parametrize("mode", list(HiddenMode))
def test_what_capture_records_returns_the_modes_outputs_as_eager_does(mode):
    from cgtool.runtime.engine import decode_batch

    model_runner = _cpu_runner()
    rows = [model_runner.kv_pool.alloc_request(8)[0] for _ in range(3)]
    batch = decode_batch(model_runner.kv_pool, rows, [4, 6, 2], [5, 9, 11])
    runner = DecodeGraphRunner(model_runner, [1, 4], hidden_mode=mode)
    # The torch reference backend reads lengths on the host, which a captured batch leaves
    # empty (Triton reads them on the device): give them to it from the static buffer.
    static_batch = runner.static_batch
    runner.static_batch = lambda bs: dataclasses.replace(
        static_batch(bs), seq_lens_cpu=runner.seq_lens[:bs].tolist())
    eager = [t.clone() for t in runner.eager_outputs(batch)]
    bs = runner.load_inputs(batch)  # padded to 4, as replay does
    runner.forward_static(bs)
    static = runner._outputs(runner.logits, runner.hidden_states, batch.batch_size)
    assert len(static) == len(eager) == (1 if mode is HiddenMode.NULL else 2)
    for got, expected in zip(static, eager):
        torch.testing.assert_close(got, expected)
    assert static[0].shape == (3, model_runner.model.cfg.vocab_size)
