"""The merge of MLA decode's chunks inside the value projection, against its torch reference.

Runs in Triton's interpreter without a GPU (conftest sets TRITON_INTERPRET); on the GPU,
test_mla_gpu.py runs it after the stage 1 that writes its plan.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="interpreter tests; on a GPU, test_mla_gpu.py runs the kernel"
)

from cgtool.attention.mla_merge_projection import BLOCK_M, BLOCK_V, merge_project, merge_project_ref


def partials(chunks: list[int], heads: int, rank: int, gen: torch.Generator):
    """Flat partial slots for requests of `chunks` chunks (laid end to end, two spare slots
    of garbage between runs no request names) and the plan naming them."""
    slots = sum(chunks) + 2
    mid_out = torch.randn(1, heads, slots, rank, generator=gen)
    mid_lse = torch.randn(1, heads, slots, generator=gen) * 4
    firsts = torch.tensor([0, *chunks[:-1]]).cumsum(0)
    plan = torch.stack([firsts, torch.tensor(chunks)], 1).to(torch.int32).contiguous()
    return mid_out, mid_lse, plan


@pytest.mark.parametrize("chunks", [[1], [3, 1, 4, 1, 5], [2] * (BLOCK_M + 3), [4, 0, 2]])
def test_merge_in_the_projection_matches_the_reference(chunks):
    # One chunk, uneven counts, more requests than one row block, and a request of no chunks
    # (a zero length), whose row is zeros.
    gen = torch.Generator().manual_seed(len(chunks))
    heads, rank, v = 2, 16, BLOCK_V
    mid_out, mid_lse, plan = partials(chunks, heads, rank, gen)
    w_uv = torch.randn(heads, 16 + v, rank, generator=gen)[:, 16:]  # rows at kv_b_proj's stride
    out = torch.full((len(chunks), heads * v), float("nan"))
    merge_project(mid_out, mid_lse, plan, w_uv, out)
    want = merge_project_ref(mid_out, mid_lse, plan, w_uv)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    zero_rows = [i for i, c in enumerate(chunks) if c == 0]
    assert all((out[i] == 0).all() for i in zero_rows)


def test_reference_merges_by_base_two_log_sum_exps():
    # Two chunks of one head whose base-2 log-sum-exps differ by one: weights 1/3 and 2/3.
    mid_out = torch.tensor([[[[3.0], [6.0]]]])
    mid_lse = torch.tensor([[[0.0, 1.0]]])
    plan = torch.tensor([[0, 2]], dtype=torch.int32)
    w_uv = torch.ones(1, 1, 1)
    assert merge_project_ref(mid_out, mid_lse, plan, w_uv).item() == pytest.approx(5.0)
