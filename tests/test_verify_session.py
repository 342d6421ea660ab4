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
