"""The merge of MLA decode's chunks inside the value projection: the kernel against its torch
reference, and how decode_projected launches it after gluon_mla_wgmma's stage 1.

Runs in Triton's interpreter without a GPU (conftest sets TRITON_INTERPRET), the Gluon stage 1
stood in for; on the GPU, test_mla_gpu.py runs both kernels.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="interpreter tests; on a GPU, test_mla_gpu.py runs the kernel"
)

from cgtool.attention import mla_merge_projection
from cgtool.attention.mla_merge_projection import (
    BLOCK_M,
    BLOCK_V,
    merge_project,
    merge_project_ref,
    requests_a_program,
)
from cgtool.runtime.triton_launch import cdiv

# Both merges (GROUP chunks of every request a step; over slots past GROUP chunks), a row block
# of BLOCK_M requests a program or spread over ROW_BLOCKS programs.
MERGES = [pytest.param(by_slots, spread, id=f"by_slots={by_slots}-spread={spread}")
          for by_slots in (True, False) for spread in (True, False)]


def partials(chunks: list[int], heads: int, rank: int, gen: torch.Generator):
    """Flat partial slots for requests of `chunks` chunks (laid end to end, two spare slots
    of garbage past them that no request names) and the requests' (first slot, chunks)."""
    slots = sum(chunks) + 2
    mid_out = torch.randn(1, heads, slots, rank, generator=gen)
    mid_lse = torch.randn(1, heads, slots, generator=gen) * 4
    firsts = torch.tensor([0, *chunks[:-1]]).cumsum(0)
    plan = torch.stack([firsts, torch.tensor(chunks)], 1).to(torch.int32).contiguous()
    return mid_out, mid_lse, plan


@pytest.mark.parametrize(("by_slots", "spread"), MERGES)
@pytest.mark.parametrize("chunks", [[1], [3, 1, 4, 1, 5], [2] * (BLOCK_M + 3), [4, 0, 2], [9, 2, 1],
                                    [1] * 5 + [40] + [2] * 4])
@pytest.mark.parametrize("transposed", [True, False])
def test_merge_in_the_projection_matches_the_reference(monkeypatch, chunks, by_slots, spread, transposed):
    # One chunk, uneven counts, more requests than one row block, a request of no chunks (a
    # zero length), whose row is zeros, more chunks than a group (three groups), and one long
    # request among short ones (more slots than one step over slots); the product either way.
    monkeypatch.setattr(mla_merge_projection, "PRODUCT_T", transposed)
    monkeypatch.setattr(mla_merge_projection, "BY_SLOTS", by_slots)
    monkeypatch.setattr(mla_merge_projection, "SPREAD", spread)
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


@pytest.mark.parametrize(("by_slots", "spread"), MERGES)
@pytest.mark.parametrize("garbage", [float("nan"), float("inf"), float("-inf")])
def test_a_slot_no_request_names_weighs_nothing_whatever_it_holds(monkeypatch, by_slots, spread, garbage):
    # The flat plan gives a request of no keys a slot that stage 1 never writes, and its
    # requests' row (first slot, 0 chunks): between the others' slots, that slot may hold
    # anything, here a value that is not finite, which a weight of nought would still carry
    # into a product.
    monkeypatch.setattr(mla_merge_projection, "BY_SLOTS", by_slots)
    monkeypatch.setattr(mla_merge_projection, "SPREAD", spread)
    gen = torch.Generator().manual_seed(7)
    heads, rank, v = 2, 16, BLOCK_V
    assert 10 > mla_merge_projection.MERGE_GROUP  # the last request's chunks take the merge over slots
    mid_out, mid_lse, _ = partials([3, 1, 10], heads, rank, gen)
    mid_out[0, :, 3] = garbage
    mid_lse[0, :, 3] = garbage
    plan = torch.tensor([[0, 3], [3, 0], [4, 10]], dtype=torch.int32)
    w_uv = torch.randn(heads, v, rank, generator=gen)
    out = torch.full((3, heads * v), float("nan"))
    merge_project(mid_out, mid_lse, plan, w_uv, out)
    torch.testing.assert_close(out, merge_project_ref(mid_out, mid_lse, plan, w_uv), rtol=1e-4, atol=1e-4)
    assert (out[1] == 0).all()


def test_requests_spread_so_that_a_column_block_takes_row_blocks_programs(monkeypatch):
    monkeypatch.setattr(mla_merge_projection, "SPREAD", True)
    assert [requests_a_program(bs) for bs in (1, 5, 8, 16, 17, 32, 64, 66)] == [1, 2, 2, 4, 5, 8, 16, 16]
    monkeypatch.setattr(mla_merge_projection, "SPREAD", False)
    assert {requests_a_program(bs) for bs in (1, 8, 66)} == {BLOCK_M}


def test_reference_merges_by_base_two_log_sum_exps():
    # Two chunks of one head whose base-2 log-sum-exps differ by one: weights 1/3 and 2/3.
    mid_out = torch.tensor([[[[3.0], [6.0]]]])
    mid_lse = torch.tensor([[[0.0, 1.0]]])
    plan = torch.tensor([[0, 2]], dtype=torch.int32)
    w_uv = torch.ones(1, 1, 1)
    assert merge_project_ref(mid_out, mid_lse, plan, w_uv).item() == pytest.approx(5.0)


def _decode_projected_on_cpu(monkeypatch, bs: int, stage1, memo: dict | None = None,
                             layers: int = 1) -> tuple[bool, list]:
    """decode_projected over a CPU latent pool, `layers` times over the same batch, its checks
    passed and its kernels stood in for (the step's plan is computed, in the interpreter):
    `stage1` for gluon_mla_wgmma's, a recorder for the projection's. (True/False, its launches)."""
    from test_triton_mla import latent_pool, latent_q

    from cgtool.attention import gluon_mla_wgmma, mla_merge_projection

    launches: list = []

    class Recording:
        def launch(self, grid, *args, **kwargs):
            launches.append({**kwargs, "grid": grid, "args": args})

    monkeypatch.setattr(mla_merge_projection, "serves", lambda q, w_uv: True)
    monkeypatch.setattr(gluon_mla_wgmma, "_mla_decode_stage1_wgmma", stage1)
    monkeypatch.setattr(mla_merge_projection, "_MERGE_PROJECT", Recording())
    monkeypatch.setattr(gluon_mla_wgmma, "_REFUSED", [])
    seq_lens = [40 + 9 * i for i in range(bs)]
    pool, rows = latent_pool(seq_lens, 16, 512, 64, torch.float32, "cpu")
    q = latent_q(bs, 16, 576, torch.float32, "cpu").view(bs, 16, 576)
    w_uv = torch.randn(16, 256, 512)[:, 128:]
    out = torch.empty(bs, 16 * 128)
    args = (pool.req_to_token, torch.tensor(rows, dtype=torch.int32), torch.tensor(seq_lens, dtype=torch.int32))
    done = [mla_merge_projection.decode_projected(q, pool.k_buffers[0], w_uv, out, *args, 576**-0.5, memo=memo)
            for _ in range(layers)]
    return all(done), launches


def test_every_batch_size_launches_stage1_and_the_plan_with_the_same_constexprs(monkeypatch):
    # A constexpr is compiled per value: the plan's program count and the chunk cap, which vary
    # with the batch size, go at run time or not at all, so one compile serves a plan's sizes.
    from test_gluon_mla import _RecordingKernel

    from cgtool.attention import mla_flat_plan

    plans: list = []

    class RecordingPlan:
        def launch(self, grid, *args, **kwargs):
            plans.append(kwargs)
            return mla_flat_plan._flat_plan_kernel[grid](*args, **kwargs)

    monkeypatch.setattr(mla_flat_plan, "_FLAT_PLAN", RecordingPlan())
    stage1 = _RecordingKernel()
    sizes = (5, 9, 12, 21, 64)
    for bs in sizes:
        _decode_projected_on_cpu(monkeypatch, bs, stage1)
    assert len({mla_merge_projection.plan_programs(bs) for bs in sizes}) == len(sizes)  # five counts

    def constexprs(launch):
        return {k: v for k, v in launch.items() if k[0].isupper() and k not in ("Trace", "Entries")}

    assert [launch["programs"] for launch in stage1.launches] == [mla_merge_projection.plan_programs(bs) for bs in sizes]
    assert all(constexprs(launch) == constexprs(stage1.launches[0]) for launch in stage1.launches)
    # The plan's batch block is a power of two of the batch: one compile a power.
    assert all({k: v for k, v in constexprs(p).items() if k != "BATCH_BLOCK"}
               == {k: v for k, v in constexprs(plans[0]).items() if k != "BATCH_BLOCK"} for p in plans)


@pytest.mark.parametrize(("bs", "programs"), [(20, 132), (21, 125)])
def test_stage1_and_the_projection_read_the_steps_flat_plan(monkeypatch, bs, programs):
    # The flat stage 1 without tickets, released for the projection, which runs a 16-row block
    # of every head and 64-column block over its partials; both read one plan of the step,
    # shared among `plan_programs` (bs 21: fewer than stage 1 may run).
    from test_gluon_mla import _RecordingKernel

    from cgtool.attention import gluon_mla_wgmma, triton_mla
    from cgtool.attention.mla_flat_plan import flat_plan_ref

    assert mla_merge_projection.plan_programs(bs) == programs
    stage1 = _RecordingKernel()
    done, projection = _decode_projected_on_cpu(monkeypatch, bs, stage1)
    (launch,) = stage1.launches
    assert done and launch["UNMERGED"] is True and launch["FLAT"] is True and launch["FUSED_MERGE"] is False
    assert launch["grid"] == (programs + bs, 1, 1) and launch["programs"] == programs
    (merge,) = projection
    assert merge["grid"] == (16, 128 // BLOCK_V, cdiv(bs, requests_a_program(bs)))
    assert merge["args"][0] is launch["args"][2] and merge["args"][1] is launch["args"][3]  # its partials
    entries, requests = launch["Entries"], merge["args"][2]
    assert entries.shape == (programs + bs, 8) and requests.shape == (bs, 2)
    assert entries.untyped_storage().data_ptr() == requests.untyped_storage().data_ptr()  # one plan
    want_entries, want_requests = flat_plan_ref(
        [40 + 9 * i for i in range(bs)], launch["args"][7].tolist(), programs, triton_mla.WGMMA_MIN_CHUNK,
        gluon_mla_wgmma.WGMMA_TILES[0])
    assert [tuple(r) for r in requests.tolist()] == want_requests
    assert [tuple(e[:7]) for e in entries.tolist()][:bs] == want_entries[:bs]
    # Planned by this call, just before stage 1: stage 1 reads it after its wait.
    assert launch["ENTRY_AFTER_WAIT"] is True


@pytest.mark.parametrize("memo", [{}, None])
def test_a_later_layer_reads_the_plan_the_first_planned_before_its_wait(monkeypatch, memo):
    # With the forward's memo the first layer plans and the rest read its plan before their wait;
    # without one each layer plans again and reads it after.
    from test_gluon_mla import _RecordingKernel

    stage1 = _RecordingKernel()
    _decode_projected_on_cpu(monkeypatch, 20, stage1, memo, layers=3)
    entries = [launch["Entries"] for launch in stage1.launches]
    after_wait = [launch["ENTRY_AFTER_WAIT"] for launch in stage1.launches]
    if memo is None:
        assert after_wait == [True] * 3 and len({e.data_ptr() for e in entries}) == 3
    else:
        assert after_wait == [True, False, False] and len({e.data_ptr() for e in entries}) == 1 and len(memo) == 1


@pytest.mark.parametrize("gluon", [True, False])
def test_the_projection_runs_its_gluon_kernel_where_gluon_runs(monkeypatch, gluon):
    # GLUON_KERNEL: on a GPU that runs Gluon, gluon_mla_projection's kernel over the same grid
    # and requests a program (stamps and PROJECT_FIRST included); elsewhere, or turned off, the
    # Triton kernel.
    from cgtool.attention import gluon_mla, gluon_mla_projection, mla_merge_projection

    calls: list = []
    monkeypatch.setattr(mla_merge_projection, "GLUON_KERNEL", gluon)
    monkeypatch.setattr(gluon_mla, "available", lambda device: True)
    monkeypatch.setattr(gluon_mla_projection, "merge_project", lambda *args: calls.append(("gluon", args)))
    monkeypatch.setattr(mla_merge_projection, "_MERGE_PROJECT",
                        type("Recording", (), {"launch": lambda self, grid, *a, **k: calls.append(("triton", grid))})())
    mid_out, mid_lse, plan = partials([3] * 20, 2, 16, torch.Generator().manual_seed(0))
    w_uv, out, trace = torch.randn(2, BLOCK_V, 16), torch.empty(20, 2 * BLOCK_V), torch.zeros(64, 8, dtype=torch.int64)
    merge_project(mid_out, mid_lse, plan, w_uv, out, trace)
    ((kind, args),) = calls
    if not gluon:
        assert kind == "triton" and args == (2, 1, cdiv(20, requests_a_program(20)))
        return
    assert kind == "gluon" and args[0] is mid_out and args[2] is plan and args[4] is out and args[8] is trace
    assert args[5:8] == (BLOCK_M, BLOCK_V, requests_a_program(20)) and args[9] is mla_merge_projection.PROJECT_FIRST
    assert args[10] is mla_merge_projection.WIDE_STEP


@pytest.mark.parametrize("context", [1024, 2048, 4096, 8192])
def test_equal_lengths_give_a_program_one_step_of_slots_or_rows_of_four_chunks(monkeypatch, context):
    # The Gluon projection takes a program's slots in one step, projected first, up to SLOTS
    # (two steps with WIDE_STEP, then the merge over slots), and rows of up to four chunks
    # elementwise. At equal lengths the step's plan over `plan_programs` keeps every program
    # within one of the two; over all WGMMA_PROGRAMS (CAP_CHUNKS off) some held 33-52 slots
    # (bs 21-22 x 1k, 9-12 x 2k, more at 4k-8k), never more than two steps.
    from cgtool.attention import gluon_mla_projection, gluon_mla_wgmma, triton_mla
    from cgtool.attention.mla_flat_plan import flat_plan_ref

    def most_slots() -> dict[int, tuple[int, int]]:
        found = {}
        for bs in range(mla_merge_projection.MIN_BS, mla_merge_projection.MAX_BS + 1):
            _, requests = flat_plan_ref([context] * bs, list(range(bs)), mla_merge_projection.plan_programs(bs),
                                        triton_mla.WGMMA_MIN_CHUNK, gluon_mla_wgmma.WGMMA_TILES[0])
            per = requests_a_program(bs)
            found[bs] = (max(sum(c for _, c in requests[i:i + per]) for i in range(0, bs, per)),
                         max(c for _, c in requests))
        return found

    step = gluon_mla_projection.SLOTS
    assert all(slots <= step or chunks <= 4 for slots, chunks in most_slots().values())
    monkeypatch.setattr(mla_merge_projection, "CAP_CHUNKS", False)
    uncapped = most_slots()
    assert max(slots for slots, _ in uncapped.values()) <= 2 * step
    past = {bs for bs, (slots, chunks) in uncapped.items() if slots > step and chunks > 4}
    assert past >= {1024: {21, 22}, 2048: {9, 10, 11, 12}, 4096: {5, 6}, 8192: {5, 6}}[context]


def test_a_refused_stage1_leaves_the_attention_and_product_to_the_caller(monkeypatch):
    from test_gluon_mla import _RefusingKernel

    with pytest.warns(RuntimeWarning, match="refused gluon_mla_wgmma"):
        done, projection = _decode_projected_on_cpu(monkeypatch, 20, _RefusingKernel())
    assert done is False and projection == []


def test_it_serves_no_cpu_batch_and_no_extend():
    # The path needs Gluon on a Hopper GPU; a backend asked for it in extend declines at once.
    from test_triton_mla import latent_pool, latent_q

    from cgtool.attention.mla_merge_projection import serves
    from cgtool.attention.triton_backend import TritonAttentionBackend
    from cgtool.runtime.engine import extend_batch

    q = latent_q(20, 16, 576, torch.float32, "cpu").view(20, 16, 576)
    assert not serves(q, torch.empty(16, 128, 512))
    pool, rows = latent_pool([8], 16, 512, 64, torch.float32, "cpu")
    batch = extend_batch(pool, rows, [0], [[0] * 8])
    backend = TritonAttentionBackend(16, 576)
    assert backend.forward_projected(torch.empty(8, 16 * 576), torch.empty(16, 128, 512),
                                     torch.empty(8, 16 * 128), 0, batch, pool) is False
