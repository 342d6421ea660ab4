"""What both runners share: one global graph memory pool, the capture-mode flag, GC freezing."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

_global_graph_pool: Any = None
_capture_mode = False
_gc_frozen_depth = 0


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


@contextmanager
def freeze_gc(enable_cudagraph_gc: bool) -> Iterator[None]:
    """Collect once, then keep the collector off while graphs are recorded.

    A collection during capture can free tensors whose memory the graph is recording into
    and makes capture slow; SGLang freezes it unless --enable-cudagraph-gc is given.
    """
    global _gc_frozen_depth
    if _gc_frozen_depth:  # nested inside a frozen capture loop: collected already
        yield
        return
    gc.collect()
    should_freeze = not enable_cudagraph_gc
    if should_freeze:
        gc.freeze()
        gc.disable()
        _gc_frozen_depth += 1
    try:
        yield
    finally:
        if should_freeze:
            _gc_frozen_depth -= 1
            gc.enable()
            gc.unfreeze()


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
