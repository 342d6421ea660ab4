"""Which (request, chunk) each of gluon_mla_wgmma's flat programs takes: planned once a forward.

The flat stage 1 runs `programs` + bs programs. Each request gets chunks in proportion to its
whole key tiles (at least one, no other cap), the requests' chunks laid end to end in the
batch's order, one partial slot a chunk; the programs past the last chunk are spares. Every
layer of a decode step has the same lengths, so the mapping is computed by one small kernel
for the step (`flat_plan`, memoised on the forward as triton_decode's chunk plan is), and read:

- by stage 1, one entry a program, before its wait on the step's store: the scan over the
  batch that each program ran before costs the layer nothing then;
- by the value projection's merge (mla_merge_projection), each request's first slot and chunk
  count, also before its wait: they used to come from stage 1 after it, one more round trip
  to L2 on the path from stage 1's end to the projection's product.

The kernel that computes it is the mapping's one definition; `flat_plan_ref` restates it in
Python for the tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from cgtool.runtime.dependent_launch import (
    dependent_launch,
    release_next_kernel,
    wait_for_previous_kernel,
)
from cgtool.runtime.triton_launch import CachedKernel, cdiv

# int32s of a program's entry: its request (bs for a spare), its chunk, the request's chunks,
# its first slot, keys a chunk, the request's length and pool row, then padding to 32 bytes.
ENTRY = 8
FIELDS = ("request", "chunk", "chunks", "first", "keys", "length", "pool_row")
BLOCK_PROGRAMS = 64  # entries a program of the plan kernel writes


@triton.jit
def _flat_plan_kernel(
    seq_lens, req_pool_indices, Entries, Requests, batch, programs,
    BLOCK_N: tl.constexpr, MIN_CHUNK: tl.constexpr, BATCH_BLOCK: tl.constexpr,
    BLOCK_P: tl.constexpr, ENTRY_INTS: tl.constexpr, PDL: tl.constexpr,
):
    # Launched as the step's store's dependent, it needs only the lengths, written before the
    # store began: stage 1, its own dependent, may be scheduled at once and waits for this
    # kernel's end, which waits for the store's (stage 1 reads the rows the store writes).
    # Then the plan costs the first layer little more than reading it after the wait.
    release_next_kernel(PDL)
    offs = tl.arange(0, BATCH_BLOCK)
    valid = offs < batch
    lens = tl.load(seq_lens + offs, mask=valid, other=0)
    pool_rows = tl.load(req_pool_indices + offs, mask=valid, other=0)
    # Whole tiles only, so that a replay's padding (one key a request) shares the programs as
    # the batch alone does.
    whole = tl.maximum(tl.sum(lens // BLOCK_N, 0), 1)
    asked = tl.maximum(programs * (lens // BLOCK_N) // whole, 1)
    keys = tl.maximum(tl.cdiv(tl.cdiv(lens, BLOCK_N), asked) * BLOCK_N, MIN_CHUNK)
    chunks = tl.where(valid, tl.maximum(tl.cdiv(lens, keys), 1), 0)
    ends = tl.cumsum(chunks, 0)
    firsts = ends - chunks
    if tl.program_id(0) == 0:
        # The merge's view: a request of no keys has no partial to merge.
        tl.store(Requests + 2 * offs, firsts, mask=valid)
        tl.store(Requests + 2 * offs + 1, tl.where(lens > 0, chunks, 0), mask=valid)
    entry_ids = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    # A spare (past the last chunk) gets request `batch`.
    request = tl.minimum(tl.sum((ends[None, :] <= entry_ids[:, None]).to(tl.int32), 1), batch)
    mine = (offs[None, :] == request[:, None]) & valid[None, :]  # [BLOCK_P, BATCH_BLOCK]: a spare's none
    first = tl.sum(tl.where(mine, firsts[None, :], 0), 1)
    entry = Entries + entry_ids * ENTRY_INTS
    in_grid = entry_ids < programs + batch
    # A spare's fields past its request are zeros.
    tl.store(entry, request, mask=in_grid)
    tl.store(entry + 1, tl.where(request < batch, entry_ids - first, 0), mask=in_grid)
    tl.store(entry + 2, tl.sum(tl.where(mine, chunks[None, :], 0), 1), mask=in_grid)
    tl.store(entry + 3, first, mask=in_grid)
    tl.store(entry + 4, tl.sum(tl.where(mine, keys[None, :], 0), 1), mask=in_grid)
    tl.store(entry + 5, tl.sum(tl.where(mine, lens[None, :], 0), 1), mask=in_grid)
    tl.store(entry + 6, tl.sum(tl.where(mine, pool_rows[None, :], 0), 1), mask=in_grid)
    wait_for_previous_kernel(PDL)


_FLAT_PLAN = CachedKernel(_flat_plan_kernel)


@dataclass(frozen=True)
class FlatPlan:
    """A step's flat mapping on the GPU: `entries` int32 [programs + bs, ENTRY] (FIELDS, then
    padding), `requests` int32 [bs, 2] (first slot, chunks; 0 chunks for a request of no keys).
    `fresh`: launched by this call, just before the stage 1 that reads it, which must then
    read it after its wait (the plan kernel is the kernel it follows) rather than before."""

    entries: torch.Tensor
    requests: torch.Tensor
    fresh: bool


def flat_plan(
    seq_lens: torch.Tensor, req_pool_indices: torch.Tensor, programs: int, min_chunk: int, block_n: int,
    memo: dict[object, Any] | None = None,
) -> FlatPlan:
    """The flat mapping of this batch (one launch), or the one a layer of this forward already
    planned from the same tensors (`memo`, `batch.forward_memo()`): the lengths are the same
    for every layer, and inside a capture the first layer's kernel is captured and recomputes
    it on each replay."""
    bs = seq_lens.shape[0]
    key = ("mla_flat_plan", seq_lens.data_ptr(), req_pool_indices.data_ptr(), bs, programs, min_chunk, block_n)
    found = memo.get(key) if memo is not None else None
    if found is not None:
        return FlatPlan(found.entries, found.requests, fresh=False)
    total = programs + bs
    store = torch.empty(total * ENTRY + 2 * bs, dtype=torch.int32, device=seq_lens.device)
    plan = FlatPlan(store[: total * ENTRY].view(total, ENTRY), store[total * ENTRY:].view(bs, 2), fresh=True)
    # `programs` at run time, not a constexpr: it varies with the batch size (plan_programs), and
    # each constexpr value would be a compile of its own.
    _FLAT_PLAN.launch(
        (cdiv(total, BLOCK_PROGRAMS),), seq_lens, req_pool_indices, plan.entries, plan.requests, bs, programs,
        BLOCK_N=block_n, MIN_CHUNK=min_chunk, BATCH_BLOCK=triton.next_power_of_2(bs),
        BLOCK_P=BLOCK_PROGRAMS, ENTRY_INTS=ENTRY, **dependent_launch(seq_lens.device), num_warps=4, num_stages=1,
    )
    if memo is not None:
        memo[key] = plan
    return plan


def flat_plan_ref(seq_lens: list[int], pool_rows: list[int], programs: int, min_chunk: int,
                  block_n: int) -> tuple[list[tuple[int, ...]], list[tuple[int, int]]]:
    """`flat_plan`'s entries (FIELDS) and requests in Python, for the tests."""
    whole = max(sum(n // block_n for n in seq_lens), 1)
    chunks, keys, firsts = [], [], []
    for n in seq_lens:
        asked = max(programs * (n // block_n) // whole, 1)
        keys.append(max(cdiv(cdiv(n, block_n), asked) * block_n, min_chunk))
        firsts.append(sum(chunks))
        chunks.append(max(cdiv(n, keys[-1]), 1))
    owner = [b for b, c in enumerate(chunks) for _ in range(c)]
    entries = []
    for p in range(programs + len(seq_lens)):
        if p < len(owner):
            b = owner[p]
            entries.append((b, p - firsts[b], chunks[b], firsts[b], keys[b], seq_lens[b], pool_rows[b]))
        else:
            entries.append((len(seq_lens), 0, 0, 0, 0, 0, 0))
    requests = [(f, c if n > 0 else 0) for f, c, n in zip(firsts, chunks, seq_lens)]
    return entries, requests
