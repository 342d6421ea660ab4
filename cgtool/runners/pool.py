"""What both runners share: one global graph memory pool, the capture-mode flag, GC freezing
and the per-size step of their capture loops."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

_global_graph_pool: Any = None
_capture_mode = False


def get_global_graph_memory_pool() -> Any:
    """One pool for every graph of every runner, created on first use (as SGLang does)."""
    global _global_graph_pool
    if _global_graph_pool is None:
        _global_graph_pool = torch.cuda.graph_pool_handle()
    return _global_graph_pool


def reset_global_graph_memory_pool() -> None:
    """Start a new pool for later captures (tests, and after an aborted capture). Graphs
    already captured keep the old pool alive through their own reference to it."""
    global _global_graph_pool
    _global_graph_pool = None


def is_capture_mode() -> bool:
    return _capture_mode


@contextmanager
def model_capture_mode() -> Iterator[None]:
    global _capture_mode
    previous, _capture_mode = _capture_mode, True
    try:
        yield
    finally:
        _capture_mode = previous


# Runs around one size's capture, given its place in the capture order, the size and the
# capture itself (`record`), which it calls: progress, a TP barrier, measuring. It returns
# whether the runner goes on to the next, smaller size (False stops the loop).
SizeStep = Callable[[int, int, Callable[[], None]], bool]


def just_record(index: int, size: int, record: Callable[[], None]) -> bool:
    record()
    return True


@contextmanager
def freeze_gc(enable_cudagraph_gc: bool, collect: bool = True) -> Iterator[None]:
    """Collect once (unless `collect` is False), then keep the collector off while graphs
    are recorded, or while eager steps are timed (a collection's pause in one step would be
    timed as the step's).

    GC is frozen in one place only, around a runner's whole capture loop, as SGLang and
    nano-vllm do: one collection first frees dead cycles before the largest graph sizes the
    pool; after it, an automatic collection mid-capture could destroy a stray CUDA graph,
    which CUDA forbids while a stream captures (pytorch#161037), and rescanning a loaded
    model's objects per size costs tens of milliseconds. torch.cuda.graph itself no longer
    collects on entry (pytorch#158193, 2025; read in torch 2.13, TORCH_CUDAGRAPH_GC=1 brings
    it back), so neither one size's capture nor a piecewise piece needs a freeze or a patched
    gc.collect of its own. --enable-cudagraph-gc keeps the collector on, as SGLang's flag does.
    """
    was_enabled = gc.isenabled()
    if collect:
        gc.collect()
    should_freeze = not enable_cudagraph_gc
    if should_freeze:
        gc.freeze()
        gc.disable()
    try:
        yield
    finally:
        if should_freeze:
            gc.unfreeze()
            if was_enabled:
                gc.enable()


_failed_graphs: list[Any] = []


@contextmanager
def keep_graph_if_capture_fails(graph: Any) -> Iterator[None]:
    """A graph whose capture raised (out of memory, Ctrl-C) is kept, not freed: freeing a
    graph while the shared pool still takes captures trips an assertion in the allocator."""
    try:
        yield
    except BaseException:
        _failed_graphs.append(graph)
        raise
