"""The verify session's handling of a fraction that leaves no room to load (CPU: the GPU
calls are stood in for; tests/test_verify_gpu.py runs the real thing)."""

from __future__ import annotations

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
