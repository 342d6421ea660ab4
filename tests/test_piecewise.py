import dataclasses
import gc
import random

import pytest
import silly_attention
import torch
from replay_check import assert_replay_equals_eager
from silly_attention import SILLY_OP, SillyModel

from cgtool.attention import make_backend
from cgtool.model.loader import build_model
from cgtool.runners.piecewise import PiecewiseGraphRunner
from cgtool.runners.piecewise_backend import (
    CapturablePiece,
    PiecewiseBackend,
    use_graphs_for,
    weak_ref_tensor,
)
from cgtool.runners.pool import model_capture_mode
from cgtool.runtime.batch import ForwardMode
from cgtool.runtime.engine import ModelRunner, decode_batch, extend_batch
from cgtool.runtime.kv import DUMMY_REQ, DUMMY_SLOT, KVPool
from cgtool.specs.config import load_model_config


def _model_runner(device, dtype, backend_name, num_slots=4096, max_context_len=1024):
    # Up to 4 requests a batch, each with a prefix of up to 200 tokens: slots and rows to spare.
    cfg = load_model_config("tiny")
    model = build_model(cfg, device=device, dtype=dtype, max_positions=max_context_len)
    pool = KVPool(cfg, num_slots, max_reqs=256, max_context_len=max_context_len, dtype=dtype, device=device)
    return ModelRunner(model, pool, make_backend(backend_name, cfg.num_heads, cfg.head_dim))


def _mixed_batch(model_runner, num_tokens, rng):
    """1-4 requests sharing `num_tokens` new tokens, some over a cached prefix already in the pool."""
    pool, vocab = model_runner.kv_pool, model_runner.model.cfg.vocab_size
    num_reqs = rng.randint(1, min(4, num_tokens))
    cuts = sorted(rng.sample(range(1, num_tokens), num_reqs - 1))
    new_lens = [b - a for a, b in zip([0, *cuts], [*cuts, num_tokens])]
    prefix_lens = [rng.choice([0, 0, rng.randint(1, 200)]) for _ in new_lens]
    rows = [pool.alloc_request(p + n)[0] for p, n in zip(prefix_lens, new_lens)]
    for row, prefix in zip(rows, prefix_lens):
        if prefix:  # fill the cached prefix the way a previous extend would have
            ids = [rng.randrange(vocab) for _ in range(prefix)]
            model_runner.forward_eager(extend_batch(pool, [row], [0], [ids]))
    new_ids = [[rng.randrange(vocab) for _ in range(n)] for n in new_lens]
    return extend_batch(pool, rows, prefix_lens, new_ids)


# ---------------------------------------------------------------- CPU: compile and split


@pytest.fixture(scope="module")
def cpu_runner():
    model_runner = _model_runner("cpu", torch.float32, "torch", max_context_len=512)
    runner = PiecewiseGraphRunner(model_runner, capture_num_tokens=[8, 16, 64])
    runner.warmup()
    return runner


def test_compiled_split_body_equals_eager_without_graphs(cpu_runner):
    rng = random.Random(0)
    for num_tokens in (5, 16, 37, 64, 90):  # a token count above the largest size compiles too
        batch = _mixed_batch(cpu_runner.model_runner, num_tokens, rng)
        compiled = cpu_runner.forward_compiled(batch)
        eager = cpu_runner.model_runner.forward_eager(batch)
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    cfg = cpu_runner.model_runner.model.cfg
    assert cpu_runner.backend.num_compiles == 1  # one dynamic-shape compilation for all counts
    assert len(cpu_runner.backend.pieces) == cfg.num_layers + 1
    assert all(not piece.graphs for piece in cpu_runner.backend.pieces)


def test_attention_pieces_call_the_implementation_not_the_custom_op(cpu_runner):
    from cgtool.attention.op import attention_impl

    split = cpu_runner.backend.split
    targets = [
        node.target
        for piece in split.pieces
        if piece.is_split_op
        for node in piece.graph.graph.nodes
        if node.op == "call_function"
    ]
    assert targets.count(attention_impl) == cpu_runner.model_runner.model.cfg.num_layers
    assert not any("cgtool.attention" in str(t) for t in targets)


def test_piece_refuses_to_run_eagerly_for_a_size_it_has_no_graph_of(cpu_runner):
    batch = _mixed_batch(cpu_runner.model_runner, 16, random.Random(1))
    with use_graphs_for(16), pytest.raises(RuntimeError, match="no CUDA graph for 16 tokens"):
        cpu_runner.forward_compiled(batch)


def test_silly_model_compiles_into_three_capturable_pieces():
    backend = PiecewiseBackend(split_ops=[SILLY_OP])
    compiled = torch.compile(SillyModel(), backend=backend, fullgraph=True)
    x = torch.randn(6, 4)
    before = silly_attention.calls
    torch.testing.assert_close(compiled(x), SillyModel()(x))
    assert silly_attention.calls - before == 4
    assert backend.num_compiles == 1
    assert len(backend.split.pieces) == 5
    assert [type(p) for p in backend.pieces] == [CapturablePiece] * 3


def test_static_batch_puts_capture_tokens_on_the_dummy_row_within_the_context():
    model_runner = _model_runner("cpu", torch.float32, "torch", max_context_len=24)
    runner = PiecewiseGraphRunner(model_runner, capture_num_tokens=[64])
    runner.out_cache_loc.fill_(7)  # as a replay of real slots would leave it
    batch = runner.static_batch(64)
    assert batch.extend_seq_lens_cpu == [24, 24, 16]
    assert batch.extend_start_loc.tolist() == [0, 24, 48]
    assert batch.req_pool_indices.tolist() == [DUMMY_REQ] * 3
    assert batch.out_cache_loc.tolist() == [DUMMY_SLOT] * 64
    assert batch.num_tokens == batch.num_real_tokens == 64


def test_can_run_rules(cpu_runner):
    runner = cpu_runner
    pool = runner.model_runner.kv_pool
    row = pool.alloc_request(80)[0]
    small = extend_batch(pool, [row], [0], [list(range(10))])
    largest = extend_batch(pool, [row], [0], [list(range(16))])
    too_big = extend_batch(pool, [row], [0], [list(range(17))])
    assert not runner.can_run(small)  # nothing captured yet
    runner.captured_num_tokens = [8, 16]
    try:
        assert runner.can_run(small) and runner.can_run(largest)
        assert not runner.can_run(too_big)
        assert not runner.can_run(dataclasses.replace(small, extend_logprob_start_lens_cpu=[3]))
        assert runner.can_run(dataclasses.replace(small, extend_logprob_start_lens_cpu=[10]))
        decode = decode_batch(pool, [row], [10], [1])
        assert decode.forward_mode == ForwardMode.DECODE and not runner.can_run(decode)
    finally:
        runner.captured_num_tokens = []


def test_capture_goes_largest_first_with_gc_off_until_a_step_stops_it(cpu_runner, monkeypatch):
    recorded = []
    monkeypatch.setattr(cpu_runner, "_record", lambda n: recorded.append((n, gc.isenabled())))

    def step(index, n, record):
        record()
        return n > 16  # as verify's plan set stops at its first failure

    cpu_runner.capture(step)
    assert recorded == [(64, False), (16, False)]
    assert gc.isenabled()


# ---------------------------------------------------------------- GPU: capture and replay

GPU_SIZES = [4, 16, 48, 128, 256, 512]


@pytest.fixture(scope="module")
def gpu_runner():
    # Triton on the GPU, as capture runs it: a missing Triton is a failure here, not a fallback.
    model_runner = _model_runner("cuda", torch.bfloat16, "triton", num_slots=65536)
    runner = PiecewiseGraphRunner(model_runner, capture_num_tokens=GPU_SIZES)
    runner.warmup()
    from cgtool.capture.memory import graph_pool_bytes
    from cgtool.runners.pool import get_global_graph_memory_pool, reset_global_graph_memory_pool

    # A pool of its own: earlier tests in this process leave free blocks in the shared one,
    # which the largest size would reuse without growing it.
    reset_global_graph_memory_pool()
    pool = get_global_graph_memory_pool()
    reserved_growth = {}  # growth of the shared graph pool per size

    def measured(index, n, record):
        torch.cuda.synchronize()
        before = graph_pool_bytes(pool)
        record()
        torch.cuda.synchronize()
        reserved_growth[n] = graph_pool_bytes(pool) - before
        return True

    runner.capture(measured)
    runner.reserved_growth = reserved_growth
    return runner


@pytest.mark.gpu
def test_every_capturable_piece_has_one_graph_per_size(gpu_runner):
    cfg = gpu_runner.model_runner.model.cfg
    pieces = gpu_runner.backend.pieces
    assert gpu_runner.model_runner.backend.name == "triton"
    assert gpu_runner.backend.num_compiles == 1
    assert len(pieces) == cfg.num_layers + 1
    assert sum(len(p.graphs) for p in pieces) == len(GPU_SIZES) * (cfg.num_layers + 1)
    assert all(sorted(p.graphs) == GPU_SIZES for p in pieces)
    assert gpu_runner.captured_num_tokens == GPU_SIZES


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [4, 5, 16, 40, 48, 100, 128, 200, 256, 300, 512])
def test_replay_matches_eager_at_and_between_sizes(gpu_runner, num_tokens):
    batch = _mixed_batch(gpu_runner.model_runner, num_tokens, random.Random(num_tokens))
    assert gpu_runner.can_run(batch)
    replays_before = [p.replay_count for p in gpu_runner.backend.pieces]
    runner_replays = gpu_runner.replay_count
    replayed = gpu_runner.forward(batch).clone()
    eager = gpu_runner.model_runner.forward_eager(batch)
    assert replayed.shape == eager.shape == (num_tokens, gpu_runner.model_runner.model.cfg.hidden_size)
    assert_replay_equals_eager(replayed, eager)
    # Every piece replayed its graph once: nothing ran eagerly behind the runner's back.
    assert [p.replay_count for p in gpu_runner.backend.pieces] == [r + 1 for r in replays_before]
    assert gpu_runner.replay_count == runner_replays + 1


@pytest.mark.gpu
def test_padded_tokens_write_only_the_dummy_slot(gpu_runner):
    pool = gpu_runner.model_runner.kv_pool
    batch = _mixed_batch(gpu_runner.model_runner, 21, random.Random(7))  # padded to 48
    before = [k.clone() for k in pool.k_buffers]
    gpu_runner.replay(batch)
    allowed = set(batch.out_cache_loc.tolist()) | {DUMMY_SLOT}
    for old, new in zip(before, pool.k_buffers):
        changed = (old != new).flatten(1).any(1).nonzero().flatten().tolist()
        assert changed and set(changed) <= allowed


@pytest.mark.gpu
def test_eager_fallback_above_the_largest_size(gpu_runner):
    batch = _mixed_batch(gpu_runner.model_runner, 600, random.Random(3))
    count = gpu_runner.replay_count
    assert not gpu_runner.can_run(batch)
    out = gpu_runner.forward(batch)
    assert out.shape[0] == 600 and gpu_runner.replay_count == count


@pytest.mark.gpu
def test_smaller_sizes_reuse_the_pool_of_the_largest(gpu_runner):
    growth = gpu_runner.reserved_growth
    largest = growth[max(GPU_SIZES)]
    assert largest > 0
    assert sum(growth[n] for n in GPU_SIZES[:-1]) <= largest


@pytest.mark.gpu
def test_weak_ref_tensor_aliases_without_keeping_memory():
    t = torch.randn(4096, 4096, device="cuda").to(torch.bfloat16)  # 32 MiB
    weak = weak_ref_tensor(t)
    assert weak.data_ptr() == t.data_ptr() and weak.dtype == torch.bfloat16
    assert torch.equal(weak, t)
    allocated = torch.cuda.memory_allocated()
    del t
    assert allocated - torch.cuda.memory_allocated() >= 4096 * 4096 * 2


@pytest.mark.gpu
def test_silly_model_captures_sizes_times_pieces_graphs():
    backend = PiecewiseBackend(split_ops=[SILLY_OP])
    compiled = torch.compile(SillyModel(), backend=backend, fullgraph=True)
    static = torch.zeros(8, 4, device="cuda")
    torch._dynamo.mark_dynamic(static, 0)
    compiled(static)
    stream = torch.cuda.Stream()
    with model_capture_mode(), torch.cuda.stream(stream):
        for n in (8, 4):
            with use_graphs_for(n):
                compiled(static[:n])
    torch.cuda.current_stream().wait_stream(stream)
    assert sum(len(p.graphs) for p in backend.pieces) == 2 * 3
    for n in (4, 8):
        x = torch.randn(n, 4, device="cuda")
        static[:n].copy_(x)
        with use_graphs_for(n):
            out = compiled(static[:n]).clone()
        torch.testing.assert_close(out, SillyModel()(x))
    assert [p.replay_count for p in backend.pieces] == [2, 2, 2]


@pytest.mark.gpu
def test_inductor_pieces_replay_like_eager():
    torch._dynamo.reset()  # other tests' compiled bodies would count as recompiles here
    model_runner = _model_runner("cuda", torch.bfloat16, "triton")
    runner = PiecewiseGraphRunner(model_runner, capture_num_tokens=[32, 64], compiler="inductor")
    runner.capture()
    for num_tokens in (20, 64):
        batch = _mixed_batch(model_runner, num_tokens, random.Random(num_tokens))
        replayed = runner.forward(batch).clone()
        eager = model_runner.forward_eager(batch)
        assert_replay_equals_eager(replayed, eager)
    assert runner.replay_count == 2 and runner.backend.num_compiles == 1
