"""The tensor-parallel group on torch.distributed (NCCL on GPUs, gloo on CPUs) and its collectives.

The model calls two collectives: the all-reduce after every row-parallel matmul (a custom op,
so that piecewise graphs split at it as they split at attention) and the all-gather of
vocabulary-parallel logits. With one rank neither is ever called.

While a size is recorded (warm-ups, capture) or rehearsed, `eager_collectives_skipped` keeps
both from communicating when they run eagerly: a rank that runs out of memory part-way then
leaves no peer waiting in a collective it will never issue, and the ranks agree afterwards
(`all_ranks`). Collectives issued while a CUDA stream is capturing are still issued: NCCL
records them into the graph, whose replays communicate for real.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True, slots=True)
class TensorParallel:
    rank: int = 0
    size: int = 1


SINGLE = TensorParallel()

_tp = SINGLE
_group: Any = None
_device = torch.device("cpu")
_skip_eager = False  # inside eager_collectives_skipped


def current_tp() -> TensorParallel:
    return _tp


def init_tensor_parallel(
    rank: int, size: int, init_method: str, device: torch.device, timeout: timedelta | None = None
) -> TensorParallel:
    """Join the group of `size` ranks; NCCL when `device` is a GPU, gloo otherwise. `timeout`
    bounds how long a collective waits for its peers (torch's default: 10 to 30 minutes)."""
    global _tp, _group, _device
    if device.type == "cuda":
        torch.cuda.set_device(device)
        # device_id binds the communicator to this GPU at once, so the first collective is not
        # the one that creates it (it must exist before any collective is captured).
        dist.init_process_group(
            "nccl", init_method=init_method, rank=rank, world_size=size, device_id=device,
            timeout=timeout,
        )
    else:
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=size, timeout=timeout)
    _tp, _group, _device = TensorParallel(rank, size), dist.group.WORLD, device
    return _tp


@torch.library.custom_op("cgtool::all_reduce", mutates_args=("x",))
def all_reduce(x: torch.Tensor) -> None:
    """Sum `x` over the tensor-parallel ranks, in place (left as this rank's partial sum
    inside `eager_collectives_skipped`)."""
    if not _skipped(x):
        dist.all_reduce(x, group=_group)


@all_reduce.register_fake
def _(x: torch.Tensor) -> None:
    return None


ALL_REDUCE_OP = torch.ops.cgtool.all_reduce.default

# torch 2.13 renamed all_gather_into_tensor (and deprecated the old name).
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def gather_vocab(local: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[n, shard] logits of this rank's vocabulary slice → [n, vocab_size] on every rank."""
    n, shard = local.shape
    out = torch.empty((_tp.size * n, shard), dtype=local.dtype, device=local.device)
    if not _skipped(local):  # skipped: the same buffer and view, its contents undefined
        _all_gather_single(out, local.contiguous(), group=_group)
    # Rank-major blocks of rows: put each token's shards side by side, drop the padding.
    return out.view(_tp.size, n, shard).transpose(0, 1).reshape(n, _tp.size * shard)[:, :vocab_size]


@contextmanager
def eager_collectives_skipped() -> Iterator[None]:
    """Inside, `all_reduce` and `gather_vocab` run eagerly do not communicate. For recording
    graphs and rehearsing forwards, whose outputs are thrown away: the numbers are wrong
    (partial sums), the shapes and allocations are those of the real forward."""
    global _skip_eager
    previous, _skip_eager = _skip_eager, True
    try:
        yield
    finally:
        _skip_eager = previous


def _skipped(x: torch.Tensor) -> bool:
    return _skip_eager and not (x.is_cuda and torch.cuda.is_current_stream_capturing())


def all_ranks(values: list[int]) -> list[list[int]]:
    """Every rank's `values` (the same length on each), in rank order, on every rank."""
    if _tp.size == 1:
        return [list(values)]
    table = torch.zeros((_tp.size, len(values)), dtype=torch.int64, device=_device)
    table[_tp.rank] = torch.tensor(values, dtype=torch.int64)
    dist.all_reduce(table, group=_group)  # each row is zero but on its own rank: the sum gathers
    return table.tolist()


def connect_collectives(rows: list[int], hidden: int, dtype: torch.dtype) -> None:
    """One real all-reduce of [n, hidden] for each n of `rows`, before any size records. NCCL
    sets a connection up when a collective first needs it (NCCL_RUNTIME_CONNECT, on by
    default), and recording skips eager collectives: the first use would otherwise come
    inside a capture, where setting up waits for a peer that may have run out of memory."""
    if _tp.size == 1:
        return
    for n in sorted(set(rows)):
        all_reduce(torch.zeros((n, hidden), dtype=dtype, device=_device))


def all_min(value: int) -> int:
    """The smallest `value` over the ranks (as SGLang sizes the KV pool from the tightest GPU)."""
    if _tp.size == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=_device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=_group)
    return int(t.item())


def barrier() -> None:
    if _tp.size > 1:
        dist.barrier(group=_group)


def gather_to_rank0(obj: Any) -> list[Any] | None:
    """Every rank's `obj`, in rank order, on rank 0; None elsewhere."""
    if _tp.size == 1:
        return [obj]
    out: list[Any] | None = [None] * _tp.size if _tp.rank == 0 else None
    dist.gather_object(obj, out, dst=0, group=_group)
    return out
