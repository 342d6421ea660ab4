"""The verify session's handling of a fraction that leaves no room to load (CPU: the GPU
calls are stood in for; tests/test_verify_gpu.py runs the real thing)."""

from __future__ import annotations

import itertools

import pytest
import torch

from cgtool.verify import session
from cgtool.verify.session import GraphSet, SessionOptions, run_session
from cgtool.verify.steps import Step

GIB = 1 << 30
MESSAGE = "CUDA out of memory. Tried to allocate 514.00 MiB. GPU 0 has a total capacity of 79.18 GiB"


def _options(fraction: float) -> SessionOptions:
    return SessionOptions(
        model="qwen2.5-0.5b", mem_fraction_static=fraction, steps=[Step("decode", 4, 100, 1.0)],
        sets=(GraphSet("plan", [1, 2, 4], []), GraphSet("default", [1, 2, 4, 8], [])),
        chunked_prefill_size=8192, max_running_requests=64, context_len=4096,
    )


def test_running_out_of_memory_while_loading_is_a_failed_rehearsal_with_a_remedy(monkeypatch):
    def build(cfg, weights_dir, opts, out):
        out.kv_tokens = 6_000_000
        raise torch.OutOfMemoryError(MESSAGE)

    monkeypatch.setattr(session, "_build", build)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (200 << 20, 80 * GIB))
    phases: list[str] = []
    result = run_session(_options(0.999), phases.append)
    rehearsal = result.rehearsal
    assert rehearsal is not None and rehearsal.status == "oom"
    assert rehearsal.failed_step == "loading the model, KV pool and request table"
    # 314 MiB missing plus 1 GiB of slack, out of 80 GiB: 0.999 - 0.0164, rounded down
    assert rehearsal.remedy.startswith("Lower --mem-fraction-static to 0.98 or below")
    assert result.kv_tokens == 6_000_000 and result.sets == []
    assert any(p.startswith("out of memory loading") for p in phases)


def test_another_error_while_loading_is_not_taken_for_out_of_memory(monkeypatch):
    def build(cfg, weights_dir, opts, out):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(session, "_build", build)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        run_session(_options(0.9), lambda _: None)


def test_the_verified_model_runs_the_fused_moe_kernel_as_capture_does(tmp_path):
    # The dense reference runs every expert on every token: a verify on it timed a step of
    # qwen3-30b-a3b ten times slower than the server's (issue 33).
    from hf_oracle import make_hf_model

    from cgtool.model.moe import Experts
    from cgtool.specs.config import load_model_config

    make_hf_model("qwen3_moe", tmp_path)
    cfg = load_model_config(str(tmp_path))
    opts = SessionOptions(
        model=str(tmp_path), mem_fraction_static=0.9, steps=[], sets=(GraphSet("plan", [1], []),
        GraphSet("default", [1], [])), chunked_prefill_size=64, max_running_requests=4,
        context_len=32, dtype=torch.float32,
    )
    model = session.load_model(cfg, None, opts, 32, device="cpu")
    experts = [m for m in model.modules() if isinstance(m, Experts)]
    assert experts and {e.backend for e in experts} == {"triton"}


@pytest.mark.parametrize("strict", [False, True])
def test_a_graph_the_driver_cannot_instantiate_is_a_failed_size_not_a_crash(strict):
    # Breakable prefill graphs run out of device memory in cudaGraphInstantiate, which PyTorch
    # raises as torch.AcceleratorError (qwen3-30b-a3b's default set, H200, 2026-11-26): the size
    # is noted as failed; the default's loop goes on, the plan's stops.
    failed: list[tuple[str, str]] = []
    step = session._each("piecewise", failed, strict)

    def instantiate_fails():
        raise torch.AcceleratorError("CUDA error: out of memory\nSearch for `cudaErrorMemoryAllocation'")

    assert step(0, 8192, instantiate_fails) is (not strict)
    assert failed == [("piecewise 8192", "CUDA error: out of memory\nSearch for `cudaErrorMemoryAllocation'")]


def test_another_cuda_error_while_capturing_a_size_is_raised():
    step = session._each("decode", [], strict=False)

    def illegal_access():
        raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(torch.AcceleratorError):
        step(0, 64, illegal_access)


def test_the_defaults_graphs_are_captured_after_the_rehearsals_cached_blocks_are_released(monkeypatch):
    # The rehearsal's eager steps leave their blocks cached, where no graph pool can use them:
    # the default's breakable prefill graphs then ran out of memory beside the plan's (H200).
    from cgtool.verify.result import Rehearsal
    from cgtool.verify.summary import SetMeasurement

    events: list[str] = []

    def build(cfg, weights_dir, opts, out):
        out.kv_tokens = 1000
        return object()

    def capture_set(runner, graph_set, opts, strict):
        events.append(f"capture {graph_set.name}")
        return SetMeasurement(graph_set.name, graph_set.capture_bs, [], [], 0.0, 0.0, 0, []), [], None

    import cgtool.capture.session as capture_session

    monkeypatch.setattr(capture_session, "resolve_model", lambda *a, **k: (type("C", (), {"name": "m"})(), None))
    monkeypatch.setattr(session, "_build", build)
    monkeypatch.setattr(session, "_free_gib", lambda: 1.0)
    monkeypatch.setattr(session, "_capture_set", capture_set)
    monkeypatch.setattr(session, "_rehearse", lambda runner, opts: events.append("rehearse") or Rehearsal(
        "ok", 8192, 64, 100, 0, 1 << 30, 80 << 30))
    monkeypatch.setattr(session, "_replay", lambda *a: events.append("replay"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append("empty_cache"))
    run_session(_options(0.9), lambda _: None)
    assert events == ["capture plan", "rehearse", "empty_cache", "capture default", "replay"]


def test_warmup_runs_each_shape_once_beyond_the_first_steps():
    # A kernel compiles on its first launch of a shape; a shape first met after the first
    # steps would otherwise compile inside a timed repeat.
    from cgtool.verify.session import warmup_indices
    from cgtool.verify.steps import Step

    steps = [Step("decode", 4, 100, 1.0), Step("extend", 14, 0, 1.0), Step("decode", 4, 300, 1.0),
             Step("extend", 14, 24_576, 1.0), Step("decode", 8, 50, 1.0), Step("extend", 14, 9000, 1.0),
             Step("decode", 4, 10, 1.0)]
    assert warmup_indices(steps, 2) == [0, 1, 3, 4]  # the prefixed extend of 14 is a shape of its own
    assert warmup_indices(steps, 0) == [0, 1, 3, 4]
    assert warmup_indices(steps, 32) == list(range(7))


def test_requests_are_spread_over_the_pool_each_on_its_own_run_of_slots():
    # verify maps each request row to a run of slots of its own, the rows spread over the whole
    # pool (benchmarks/probe_verify_step_gap.py compares that with capture's packed rows), and
    # fills every K/V buffer, so no step reads another request's lines or unset memory.
    from cgtool.runtime.kv import KVPool
    from cgtool.specs.config import load_model_config

    pool = KVPool(load_model_config("tiny"), num_slots=1000, max_reqs=4, max_context_len=64,
                  dtype=torch.float32, device="cpu")
    for buf in pool.k_buffers + pool.v_buffers:
        buf.zero_()
    session.spread_requests(pool, seed=0)
    rows, width = pool.req_to_token.shape
    runs = [pool.req_to_token[row] for row in range(1, rows)]
    for run in runs:  # consecutive slots, never the reserved slot 0
        assert (run.diff() == 1).all() and int(run.min()) >= 1
    starts = [int(run[0]) for run in runs]
    assert all(b - a >= width for a, b in itertools.pairwise(starts))  # apart, not touching
    assert starts[-1] > pool.num_slots // 2  # spread over the pool, not packed at its start
    assert all(bool((buf != 0).any()) for buf in pool.k_buffers + pool.v_buffers)


@pytest.mark.parametrize("latent", [True, False])
def test_the_timed_repeats_count_each_sets_redone_mla_chunks(monkeypatch, latent):
    # Reset before each set's timed steps and read after them: the warm-up is not counted.
    from types import SimpleNamespace

    from cgtool.attention import gluon_mla_wgmma, redone_chunks
    from cgtool.verify.summary import SetMeasurement

    cpu = torch.device("cpu")
    runner = SimpleNamespace(device=cpu, kv_pool=SimpleNamespace(is_latent=latent))
    monkeypatch.setattr(gluon_mla_wgmma, "counts_redone", lambda device: True)
    monkeypatch.setattr(session, "_batch", lambda runner, step, seed: step)
    # The plan's set redoes 2 chunks a step, the default's none.
    monkeypatch.setattr(session, "_as_engine_runs", lambda runner, batch, decode, piecewise: (
        lambda: redone_chunks.counter(cpu).add_(decode)))
    monkeypatch.setattr(session, "_timed_steps", lambda fns: [(fn(), 1.0)[1] for fn in fns])
    steps = [SimpleNamespace(kind="decode", size=4, context=0)] * 3
    opts = SimpleNamespace(steps=steps, seed=0, warmup_steps=2, repeats=2)
    sets = [SetMeasurement(name, [4], [], [], 1.0, 0.0, 0, []) for name in ("plan", "default")]
    session._replay(runner, opts, [(2, None), (0, None)], sets, lambda text: None)
    assert [len(s.step_ms) for s in sets] == [2, 2]
    assert [s.mla_chunks_redone for s in sets] == ([2 * 3 * 2, 0] if latent else [None, None])
