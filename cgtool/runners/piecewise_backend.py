"""cgtool's torch.compile backend: split at attention, one CUDA graph per piece per token count.

The backend splits dynamo's graph (`split_graph`), compiles every capturable piece once for
the general (dynamic) token count, and wraps it in a `CapturablePiece`. Which graph to use
is decided by the runner, never here: it names the padded token count with
`use_graphs_for(n)`, and every piece replays its graph for `n` or, in capture mode,
records it. Outside `use_graphs_for` the pieces run the general-shape code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any
from unittest.mock import patch

import torch
from torch import fx, nn

from cgtool.attention.op import ATTENTION_OP, attention_impl
from cgtool.runners.graphs import record_graph
from cgtool.runners.pool import is_capture_mode
from cgtool.runners.split import SplitGraph, split_graph
from cgtool.runtime.distributed import ALL_REDUCE_OP

COMPILERS = ("eager", "inductor")

# The tensor-parallel all-reduce splits too, as in SGLang: NCCL then runs eagerly between
# pieces, and the pieces' graphs hold no collective (TP=1 models never call it).
_split_ops: tuple[torch._ops.OpOverload, ...] = (ATTENTION_OP, ALL_REDUCE_OP)
_graph_num_tokens: int | None = None
# Split ops run eagerly between pieces; these are called as plain functions there, since
# a custom op's dispatch costs ~170 µs of host time a call (../shared/notes/eager-host-profile.md).
_EAGER_IMPLS: dict[torch._ops.OpOverload, Callable[..., Any]] = {ATTENTION_OP: attention_impl}


def registered_split_ops() -> tuple[torch._ops.OpOverload, ...]:
    return _split_ops


@contextmanager
def use_graphs_for(num_tokens: int) -> Iterator[None]:
    """Pieces called inside replay (or, in capture mode, record) their graph for `num_tokens`."""
    global _graph_num_tokens
    previous, _graph_num_tokens = _graph_num_tokens, num_tokens
    try:
        yield
    finally:
        _graph_num_tokens = previous


class _CudaArrayView:
    """`__cuda_array_interface__` over a tensor's memory that holds no reference to the tensor."""

    def __init__(self, t: torch.Tensor) -> None:
        self.__cuda_array_interface__ = {
            "shape": tuple(t.shape),
            "strides": tuple(s * t.element_size() for s in t.stride()),
            "typestr": f"<i{t.element_size()}",
            "data": (t.data_ptr(), False),
            "version": 2,
        }


_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def weak_ref_tensor(t: torch.Tensor) -> torch.Tensor:
    """A tensor over `t`'s memory that does not keep that memory allocated.

    vLLM and SGLang build it in C++ (`torch::from_blob` without a deleter). Pure Python gets
    the same through the public CUDA array interface: `torch.as_tensor` wraps the pointer
    and keeps only the small view object alive. The interface has no bfloat16, so the
    memory is viewed as a same-sized integer type and viewed back.
    """
    if not t.is_cuda or t.numel() == 0:
        return t  # no graph pool off the GPU: nothing to hand back
    raw = t.view(_INT_OF_SIZE[t.element_size()])
    return torch.as_tensor(_CudaArrayView(raw), device=t.device).view(t.dtype)


def weak_ref_tensors(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return weak_ref_tensor(value)
    if isinstance(value, (list, tuple)):
        return type(value)(weak_ref_tensors(v) for v in value)
    return value


class CapturablePiece(nn.Module):
    """One capturable piece: its general-shape code plus one CUDA graph per token count."""

    def __init__(self, runnable: Callable[..., Any], index: int) -> None:
        super().__init__()
        self.runnable = runnable
        self.index = index
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}  # kept alive: they share one pool
        self.kernel_nodes: dict[int, int | None] = {}
        self.outputs: dict[int, Any] = {}  # weak references into the pool
        self.replay_count = 0

    def forward(self, *args: Any) -> Any:
        num_tokens = _graph_num_tokens
        if num_tokens is None:
            return self.runnable(*args)
        graph = self.graphs.get(num_tokens)
        if graph is not None:
            graph.replay()
            self.replay_count += 1
            return self.outputs[num_tokens]
        if not is_capture_mode():
            # The runner only names captured sizes: running eagerly here would hide a bug.
            raise RuntimeError(f"piece {self.index} has no CUDA graph for {num_tokens} tokens")
        return self._capture(num_tokens, args)

    def _capture(self, num_tokens: int, args: Sequence[Any]) -> Any:
        self.runnable(*args)  # warm-up: lazy kernel loading and cuBLAS workspaces stay outside
        with ExitStack() as stack:
            if self.index > 0:
                # torch.cuda.graph empties the allocator's cache on entry: once per forward
                # (the first piece) is enough, not once per layer. GC is left to the runner's
                # capture loop (pool.freeze_gc), since torch.cuda.graph no longer collects.
                stack.enter_context(patch("torch.cuda.empty_cache", lambda: None))
            recorded = record_graph(lambda: self.runnable(*args), torch.cuda.current_stream())
        output = recorded.output
        self.graphs[num_tokens] = recorded.graph
        self.kernel_nodes[num_tokens] = recorded.kernels
        # Only the stitching graph's own references keep `output` alive now, so its memory
        # goes back to the pool as soon as the last piece reading it has run, and later
        # pieces and smaller sizes record into it. Replays write to the same addresses.
        self.outputs[num_tokens] = weak_ref_tensors(output)
        return output


def piece_example_inputs(split: SplitGraph, example_inputs: list[Any]) -> dict[str, list[Any]]:
    """The fake (symbolic-shaped) inputs of every piece, found by running the stitching graph."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch._guards import detect_fake_mode

    # Dynamo's own fake mode remembers each real input's fake, symbolic token dim included.
    fake_mode = detect_fake_mode()
    fakes = [fake_mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in example_inputs]
    inputs: dict[str, list[Any]] = {}

    class Recorder(fx.Interpreter):
        def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
            inputs[str(target)] = list(args)
            return super().call_module(target, args, kwargs)

    with fake_mode, enable_python_dispatcher():
        Recorder(split.stitching).run(*fakes)
    return inputs


def call_split_ops_directly(graph: fx.GraphModule) -> None:
    """Point calls of split ops that have a plain implementation at it."""
    changed = False
    for node in graph.graph.nodes:
        target = node.target
        if isinstance(target, torch._ops.OpOverloadPacket):
            target = getattr(target, "default", target)
        if node.op == "call_function" and target in _EAGER_IMPLS:
            node.target = _EAGER_IMPLS[target]
            changed = True
    if changed:
        graph.recompile()


def compile_piece(graph: fx.GraphModule, example_inputs: list[Any] | None, compiler: str) -> Callable[..., Any]:
    if compiler == "eager":
        return graph
    if compiler == "inductor":
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(graph, example_inputs)
    raise ValueError(f"unknown piecewise compiler {compiler!r}; expected one of {COMPILERS}")


class PiecewiseBackend:
    """The callable handed to `torch.compile(backend=...)`."""

    def __init__(
        self, compiler: str = "eager", split_ops: Sequence[torch._ops.OpOverload] | None = None
    ) -> None:
        if compiler not in COMPILERS:
            raise ValueError(f"unknown piecewise compiler {compiler!r}; expected one of {COMPILERS}")
        self.compiler = compiler
        self.split_ops = tuple(split_ops) if split_ops is not None else None  # None: the registry
        self.num_compiles = 0  # more than one means dynamo recompiled: a guard failed
        self.split: SplitGraph | None = None  # of the latest compilation
        # Of every compilation: dynamo compiles again for a token count of 1 (it specialises
        # sizes 0 and 1), and those pieces hold that size's graphs.
        self.pieces: list[CapturablePiece] = []
        # Dynamo's graph and inputs of the latest compilation, for the compile cache to store.
        self.traced: tuple[fx.GraphModule, list[Any]] | None = None

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        self.num_compiles += 1
        split = split_graph(gm, self.split_ops or registered_split_ops())
        # Example inputs come from running the split graph on fake tensors: the split ops must
        # still be the custom ops then, whose fake implementations touch no real buffer.
        inputs = piece_example_inputs(split, example_inputs) if self.compiler == "inductor" else {}
        for piece in split.pieces:
            if piece.is_split_op:
                call_split_ops_directly(piece.graph)
        for index, piece in enumerate(split.capturable_pieces):
            runnable = compile_piece(piece.graph, inputs.get(piece.name), self.compiler)
            wrapper = CapturablePiece(runnable, index)
            setattr(split.stitching, piece.name, wrapper)
            self.pieces.append(wrapper)
        self.split = split
        self.traced = (gm, example_inputs)
        return split.stitching
