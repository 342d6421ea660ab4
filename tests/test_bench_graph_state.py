"""benchmarks/bench_moe_mla.set_graph_state: the event each BENCH_GRAPH_STATE names runs after a capture."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_moe_mla  # benchmarks/ is not a package: found through the path above


@pytest.fixture
def events(monkeypatch):
    """What set_graph_state did: eager calls of the timed function, graphs captured, syncs."""
    seen: list[str] = []

    @contextmanager
    def capture(graph):
        seen.append("capture")
        yield

    monkeypatch.setattr(bench_moe_mla.torch.cuda, "CUDAGraph", lambda: object())
    monkeypatch.setattr(bench_moe_mla.torch.cuda, "graph", capture)
    monkeypatch.setattr(bench_moe_mla.torch.cuda, "synchronize", lambda: seen.append("sync"))
    monkeypatch.setattr(bench_moe_mla, "DEVICE", "cpu")
    return seen


@pytest.mark.parametrize(("state", "expected"), [("fast", ["eager", "sync"]), ("slow", ["capture", "sync"]),
                                                 ("as_is", ["sync"])])
def test_each_state_runs_its_event(monkeypatch, events, state, expected):
    monkeypatch.setattr(bench_moe_mla, "GRAPH_STATE", state)
    bench_moe_mla.set_graph_state(lambda: events.append("eager"))
    assert events == expected


def test_an_unknown_state_stops_the_benchmark(monkeypatch, events):
    monkeypatch.setattr(bench_moe_mla, "GRAPH_STATE", "quick")
    with pytest.raises(SystemExit, match="BENCH_GRAPH_STATE='quick'"):
        bench_moe_mla.set_graph_state(lambda: events.append("eager"))
    assert "eager" not in events
