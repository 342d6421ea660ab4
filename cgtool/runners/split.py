"""Split an FX graph at opaque ops (attention) into capturable pieces and split-op pieces.

As vLLM's backend does: every split op becomes a piece of its own, everything between two
split ops one capturable piece, and a stitching graph calls the pieces in program order.
The split ops run eagerly at replay time, so they may read host values and dynamic
metadata that a CUDA graph could not hold.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import torch
from torch import fx
from torch.fx.passes.split_module import split_module


@dataclass(frozen=True, slots=True)
class Piece:
    name: str  # attribute of the stitching graph that calls it: "submod_<partition>"
    graph: fx.GraphModule
    is_split_op: bool

    @property
    def capturable(self) -> bool:
        return not self.is_split_op


@dataclass(frozen=True, slots=True)
class SplitGraph:
    stitching: fx.GraphModule
    pieces: list[Piece]  # in the order the stitching graph calls them

    @property
    def capturable_pieces(self) -> list[Piece]:
        return [p for p in self.pieces if p.capturable]


def is_split_op(node: fx.Node, split_ops: Collection[torch._ops.OpOverload]) -> bool:
    if node.op != "call_function":
        return False
    target = node.target
    # Dynamo records `torch.ops.ns.op(...)` as the packet, not its `.default` overload.
    if isinstance(target, torch._ops.OpOverloadPacket):
        target = getattr(target, "default", target)
    return target in split_ops


def split_graph(gm: fx.GraphModule, split_ops: Collection[torch._ops.OpOverload]) -> SplitGraph:
    """Cut `gm` before and after every call of a split op; the original `gm` is left as is."""
    partition_of: dict[fx.Node, int] = {}
    split_partitions: set[int] = set()
    partition = 0
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if is_split_op(node, split_ops):
            partition += 1
            partition_of[node] = partition
            split_partitions.add(partition)
            partition += 1
        else:
            partition_of[node] = partition
    stitching = split_module(gm, None, lambda node: partition_of[node], keep_original_order=True)
    pieces = []
    for node in stitching.graph.nodes:
        if node.op == "call_module":
            index = int(str(node.target).removeprefix("submod_"))
            submodule = getattr(stitching, str(node.target))
            pieces.append(Piece(str(node.target), submodule, index in split_partitions))
    return SplitGraph(stitching, pieces)
