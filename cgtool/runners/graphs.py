"""Recording one CUDA graph into the shared pool, and counting the kernels it launches.

Every runner records through `record_graph`. The graph is made with torch's `keep_graph`,
so the captured cudaGraph_t stays readable after capture: its kernel nodes are counted
there (issue 14: a profiler pass over every size took 6 s of an 8B session) and the graph
is instantiated at once, so a capture's time and memory still include instantiation.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from cgtool.runners.pool import (
    get_global_graph_memory_pool,
    keep_graph_if_capture_fails,
    model_capture_mode,
)

# CUgraphNodeType in the driver API (cuda.h): a kernel, and a child graph (whose kernels count).
_KERNEL_NODE = 0
_CHILD_GRAPH_NODE = 4


@dataclass(frozen=True, slots=True)
class RecordedGraph:
    graph: torch.cuda.CUDAGraph
    output: Any
    kernels: int | None  # kernel nodes; None where this torch or driver cannot tell


def record_graph(forward: Callable[[], Any], stream: torch.cuda.Stream) -> RecordedGraph:
    """Capture one call of `forward` on `stream` into the global pool."""
    graph = _new_graph()
    with (
        keep_graph_if_capture_fails(graph),
        torch.cuda.graph(graph, pool=get_global_graph_memory_pool(), stream=stream),
    ):
        output = forward()
    kernels = None
    if _kept(graph):
        kernels = count_kernel_nodes(graph.raw_cuda_graph())
        graph.instantiate()
    return RecordedGraph(graph, output, kernels)


def warm_and_record(forward: Callable[[], Any], stream: torch.cuda.Stream, warmups: int = 2) -> RecordedGraph:
    """SGLang's two warm-ups on the capture stream, then the capture: lazy kernel loading and
    cuBLAS workspace set-up happen outside the graph."""
    with model_capture_mode(), torch.cuda.stream(stream):
        for _ in range(warmups):
            forward()
        recorded = record_graph(forward, stream)
    torch.cuda.current_stream().wait_stream(stream)
    return recorded


def _new_graph() -> torch.cuda.CUDAGraph:
    try:
        return torch.cuda.CUDAGraph(keep_graph=True)
    except TypeError:  # a torch without keep_graph: graphs work, kernels are counted by profiling
        return torch.cuda.CUDAGraph()


def _kept(graph: torch.cuda.CUDAGraph) -> bool:
    try:
        graph.raw_cuda_graph()
    except (AttributeError, RuntimeError):
        return False
    return True


def count_kernel_nodes(raw_graph: int) -> int | None:
    """Kernel nodes of a cudaGraph_t (child graphs included); memcpy and memset nodes are not
    kernels, as the profiler's count leaves them out too. None without the driver library."""
    driver = _driver()
    if driver is None:
        return None
    return _count(driver, ctypes.c_void_p(raw_graph))


def _count(driver: ctypes.CDLL, graph: ctypes.c_void_p) -> int:
    num = ctypes.c_size_t(0)
    _check(driver.cuGraphGetNodes(graph, None, ctypes.byref(num)), "cuGraphGetNodes")
    nodes = (ctypes.c_void_p * num.value)()
    _check(driver.cuGraphGetNodes(graph, nodes, ctypes.byref(num)), "cuGraphGetNodes")
    total = 0
    node_type = ctypes.c_int(0)
    for node in nodes:
        _check(driver.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(node_type)), "cuGraphNodeGetType")
        if node_type.value == _KERNEL_NODE:
            total += 1
        elif node_type.value == _CHILD_GRAPH_NODE:
            child = ctypes.c_void_p()
            _check(driver.cuGraphChildGraphNodeGetGraph(ctypes.c_void_p(node), ctypes.byref(child)),
                   "cuGraphChildGraphNodeGetGraph")
            total += _count(driver, child)
    return total


def _check(result: int, call: str) -> None:
    if result != 0:
        raise RuntimeError(f"{call} failed with CUresult {result}")


@functools.cache
def _driver() -> ctypes.CDLL | None:
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    pointer, size_p, int_p = ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_int)
    driver.cuGraphGetNodes.argtypes = [pointer, ctypes.POINTER(pointer), size_p]
    driver.cuGraphNodeGetType.argtypes = [pointer, int_p]
    driver.cuGraphChildGraphNodeGetGraph.argtypes = [pointer, ctypes.POINTER(pointer)]
    for fn in (driver.cuGraphGetNodes, driver.cuGraphNodeGetType, driver.cuGraphChildGraphNodeGetGraph):
        fn.restype = ctypes.c_int
    return driver
