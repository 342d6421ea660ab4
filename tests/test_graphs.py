"""Kernels counted from a captured graph: the node walk against a stand-in driver (CPU), and
the count against the profiler's on real replays (GPU)."""

from __future__ import annotations

import ctypes
from functools import partial

import pytest
import torch

from cgtool.runners import graphs

# Two graphs by handle: 1 holds a kernel, a memcpy, a child graph (2) and a kernel;
# 2 holds a kernel, a memset and a kernel. Node handles map to (type, child graph).
_GRAPHS = {1: [10, 11, 12, 13], 2: [20, 21, 22]}
_NODES = {10: (0, None), 11: (1, None), 12: (4, 2), 13: (0, None), 20: (0, None), 21: (2, None), 22: (0, None)}


class _FakeDriver:
    def __init__(self, fail: str | None = None) -> None:
        self.fail = fail

    def cuGraphGetNodes(self, graph, nodes, num):
        if self.fail == "cuGraphGetNodes":
            return 700
        handles = _GRAPHS[graph.value]
        if nodes is not None:
            for i, handle in enumerate(handles):
                nodes[i] = handle
        num._obj.value = len(handles)
        return 0

    def cuGraphNodeGetType(self, node, node_type):
        node_type._obj.value = _NODES[node.value][0]
        return 0

    def cuGraphChildGraphNodeGetGraph(self, node, child):
        child._obj.value = _NODES[node.value][1]
        return 0


def test_kernel_nodes_count_child_graphs_and_leave_out_copies(monkeypatch):
    monkeypatch.setattr(graphs, "_driver", lambda: _FakeDriver())
    assert graphs.count_kernel_nodes(1) == 4  # 10, 13, and the child's 20 and 22
    assert graphs.count_kernel_nodes(2) == 2


def test_a_failing_driver_call_is_named(monkeypatch):
    monkeypatch.setattr(graphs, "_driver", lambda: _FakeDriver(fail="cuGraphGetNodes"))
    with pytest.raises(RuntimeError, match="cuGraphGetNodes failed with CUresult 700"):
        graphs.count_kernel_nodes(1)


def test_without_the_driver_library_the_count_is_unknown(monkeypatch):
    monkeypatch.setattr(graphs, "_driver", lambda: None)
    assert graphs.count_kernel_nodes(1) is None


def test_the_stand_in_matches_ctypes_calling_convention():
    # The fake reads `.value` and `._obj`: what ctypes hands a Python callee for these types.
    num = ctypes.c_size_t(0)
    _FakeDriver().cuGraphGetNodes(ctypes.c_void_p(2), None, ctypes.byref(num))
    assert num.value == 3


@pytest.fixture(scope="module")
def gpu_bench():
    from cgtool.capture.workbench import build_workbench
    from cgtool.specs.config import load_model_config

    return build_workbench(
        load_model_config("qwen2.5-0.5b"), weights_dir=None, dtype=torch.bfloat16,
        mem_fraction_static=0.5, max_bs=8, max_tokens=64, context_len=300, seed=0, kv_tokens=8192,
    )


@pytest.mark.gpu
def test_decode_graph_kernels_equal_the_profilers_count_of_a_replay(gpu_bench):
    from cgtool.capture.per_size import _profiled_counts
    from cgtool.runners.decode import DecodeGraphRunner

    runner = DecodeGraphRunner(gpu_bench.runner, [1, 8])
    runner.capture()
    calls = [(bs, partial(runner.replay, gpu_bench.decode_batch(bs)), None) for bs in (8, 1)]
    for _, replay, _ in calls:
        replay()  # warm, as measuring leaves them
    from cgtool.capture.per_size import _counts_from_graphs

    profiled = _profiled_counts(calls)
    assert profiled[1] > 100
    # Outside the graph a replay copies the batch into the static inputs: a memcpy (not a
    # kernel) where the dtypes agree, a cast kernel where they differ.
    batch = gpu_bench.decode_batch(1)
    casts = sum(getattr(batch, name).dtype != getattr(runner, name).dtype
                for name in ("input_ids", "positions", "req_pool_indices", "seq_lens", "out_cache_loc"))
    assert all(profiled[bs] - runner.graph_kernels(bs) == casts for bs in (1, 8))
    assert _counts_from_graphs(calls, {bs: runner.graph_kernels(bs) for bs, _, _ in calls}) == profiled


@pytest.mark.gpu
def test_piecewise_counts_from_graphs_equal_profiling_every_size(gpu_bench):
    from cgtool.capture.per_size import _counts_from_graphs, _profiled_counts
    from cgtool.runners.piecewise import PiecewiseGraphRunner

    runner = PiecewiseGraphRunner(gpu_bench.runner, capture_num_tokens=[8, 16, 64])
    runner.capture()
    calls = [(n, partial(runner.replay, gpu_bench.extend_batch(n)), None) for n in (64, 16, 8)]
    for _, replay, _ in calls:
        replay()
    from_graphs = _counts_from_graphs(calls, {n: runner.graph_kernels(n) for n, _, _ in calls})
    assert all(runner.graph_kernels(n) < from_graphs[n] for n in (8, 16, 64))  # attention runs outside
    assert from_graphs == _profiled_counts(calls)
