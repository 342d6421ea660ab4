"""benchmarks/probe_decode_after_prefill.py: each event that records no graph runs what its name says."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


class _Bench:
    """Stands for the workbench: records which batches its runner ran eagerly."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, int]] = []
        self.runner = self

    def decode_batch(self, bs: int) -> tuple[str, int]:
        return ("decode", bs)

    def extend_batch(self, tokens: int) -> tuple[str, int]:
        return ("extend", tokens)

    def forward_eager(self, batch: tuple[str, int]) -> None:
        self.ran.append(batch)


@pytest.mark.parametrize(("kind", "batch"), [("eager_extend", ("extend", 512)), ("eager_default", ("decode", 1))])
def test_an_eager_event_runs_the_batch_it_names(monkeypatch, kind, batch):
    # Until 2026-11-28 `eager_extend` fell under the decode events' prefix and ran a decode
    # forward (call 20 of h200-2026-11-28-graph-gaps recorded that).
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import probe_decode_after_prefill as probe
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    monkeypatch.setattr(probe.torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(probe.torch.cuda, "stream", lambda stream: _NoStream())
    monkeypatch.setattr(probe.torch.cuda, "default_stream", lambda: None)
    bench = _Bench()
    assert probe.run_without_capture(kind, first=None, bench=bench, sizes=[1, 8])
    assert bench.ran == [batch]
    assert not probe.run_without_capture("tiny_kept", first=None, bench=bench, sizes=[1, 8])


class _NoStream:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
