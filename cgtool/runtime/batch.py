"""ForwardMode, ForwardBatch and the per-forward context the attention op reads.

Like nano-vllm's Context: the batch is set before a forward and reset after, so layers
need no extra arguments and the attention custom op can stay a split point that takes
only tensors and a layer index.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from cgtool.runtime.kv import KVPool


class ForwardMode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2

    def is_extend(self) -> bool:
        return self == ForwardMode.EXTEND

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE


@dataclass(slots=True)
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    req_pool_indices: torch.Tensor  # [bs] int64
    seq_lens: torch.Tensor  # [bs] int32, prefix + new tokens
    out_cache_loc: torch.Tensor  # [num_tokens] int64, KV slot of each new token
    seq_lens_cpu: list[int]
    # Extend only: per request, cached prefix and new tokens; start of each request's tokens.
    extend_prefix_lens: torch.Tensor | None = None  # [bs] int32
    extend_seq_lens: torch.Tensor | None = None  # [bs] int32
    extend_start_loc: torch.Tensor | None = None  # [bs] int32
    extend_prefix_lens_cpu: list[int] | None = None
    extend_seq_lens_cpu: list[int] | None = None
    # Where input-token logprobs start per request; None means only output logprobs.
    extend_logprob_start_lens_cpu: list[int] | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_real_tokens(self) -> int:
        if self.forward_mode.is_decode():
            return self.batch_size
        assert self.extend_seq_lens_cpu is not None
        return sum(self.extend_seq_lens_cpu)

    def needs_input_logprobs(self) -> bool:
        starts, lens = self.extend_logprob_start_lens_cpu, self.extend_seq_lens_cpu
        if starts is None or lens is None:
            return False
        return any(start < length for start, length in zip(starts, lens))


@dataclass(slots=True)
class ForwardContext:
    batch: ForwardBatch
    kv_pool: KVPool
    backend: Any  # an attention backend from cgtool.attention
    # Workspace every layer of this forward shares, by shape, when the caller asked for it:
    # see forward_scratch.
    scratch: dict[object, Any] | None = None
    # What every layer derives alike from the batch, worked out by the first: see forward_memo.
    memo: dict[object, Any] = field(default_factory=dict)


_context: ForwardContext | None = None


@contextmanager
def forward_context(
    batch: ForwardBatch, kv_pool: KVPool, backend: Any, share_scratch: bool = False
) -> Iterator[None]:
    """`share_scratch`: plain eager forwards only (ModelRunner.forward_eager). Under a
    capture or torch.compile's CUDA graph trees, a block kept for the whole forward is a live
    allocation the graph does not own (trees refuse it; a capture's pool grows)."""
    global _context
    previous, _context = _context, ForwardContext(batch, kv_pool, backend, {} if share_scratch else None)
    try:
        yield
    finally:
        _context = previous


def forward_scratch() -> dict[object, Any]:
    """Workspace that lives for one forward and is shared by its layers, which run one after
    the other on one stream: allocated once a step rather than once a layer (an allocation
    is microseconds of host time in eager code; inside a capture it comes from the pool).
    Outside a forward that shares, an empty dict that keeps nothing."""
    if _context is None or _context.scratch is None:
        return {}
    return _context.scratch


def forward_memo() -> dict[object, Any]:
    """Values the layers of one forward derive alike from its batch (the decode kernel's
    chunk plan), computed by the first layer and read by the rest. Inside a capture the
    first layer's kernel is captured and the rest read its output, so a replay recomputes it
    once for its new batch. Outside a forward, an empty dict that keeps nothing."""
    if _context is None:
        return {}
    return _context.memo


def scratch_empty(name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`torch.empty`, or in an eager forward that shares scratch, one block per `name` and
    shape that every layer reuses: for a tensor one layer writes and the same layer reads
    before the next layer runs (rope's q, the attention output, SiLU's output). Three such
    tensors a layer were 96 allocations of an eager 8B step; under torch.compile and inside
    a capture each call allocates, as before."""
    if _context is None or _context.scratch is None or torch.compiler.is_compiling():
        return torch.empty(shape, dtype=dtype, device=device)
    key = (name, shape, dtype)
    block = _context.scratch.get(key)
    if block is None:
        block = _context.scratch[key] = torch.empty(shape, dtype=dtype, device=device)
    return block


def get_forward_context() -> ForwardContext:
    if _context is None:
        raise RuntimeError("attention called outside forward_context(): no ForwardBatch is set")
    return _context
