"""Out of memory on one rank of --tp marks the size failed on every rank and the run goes on:
TP=2 over gloo on the CPU, two spawned processes (tests/tp_oom_worker.py)."""

from __future__ import annotations

import pytest
import torch
import tp_oom_worker
import tp_worker
from tp_oom_worker import FREE, GIB, TOTAL

from cgtool.capture import per_size
from cgtool.capture.launch import run_ranks
from cgtool.capture.options import SessionState
from cgtool.errors import EnvironmentProblem
from cgtool.runtime import distributed
from cgtool.runtime.distributed import SINGLE, all_ranks, eager_collectives_skipped

SIZES = [1, 2, 4, 8]


@pytest.mark.parametrize(("kind", "sizes", "fail_at"), [("decode", SIZES, 4), ("piecewise", [8, 16, 32], 16)])
def test_out_of_memory_recording_on_one_rank_fails_the_size_on_both_and_smaller_ones_record(kind, sizes, fail_at):
    ranks = run_ranks(tp_oom_worker.record_oom_rank, 2, (kind, sizes, 1, fail_at))
    others = [s for s in sizes if s != fail_at]
    reason = f"out of memory capturing {kind} size {fail_at} on rank 1 (free {FREE / GIB:.2f} GiB)"
    for rank, outcome in enumerate(ranks):
        assert outcome["costs"] == others  # measured on neither rank, even where it recorded
        assert outcome["replayable"] == others  # rank 0's graph of it is never replayed
        assert outcome["rows"] == [(fail_at, "failed")]
        assert outcome["reason"] == reason, rank
        failure = outcome["failed"]
        assert (failure.kind, failure.size, failure.free_bytes, failure.total_bytes) == (kind, fail_at, FREE, TOTAL)
        assert failure.shortfall_bytes == int(1.5 * GIB)
        # Every record of every size, the failed one included, issued no collective.
        assert outcome["issued"] == [0] * len(sizes)
    # Rank 0 recorded the size its peer could not: that graph is kept alive, not freed.
    assert ranks[0]["kept_alive"] >= 1 and (kind == "piecewise" or ranks[1]["kept_alive"] == 0)


def test_out_of_memory_rehearsing_a_measurement_fails_the_size_on_both_and_later_sizes_are_measured():
    ranks = run_ranks(tp_oom_worker.measure_oom_rank, 2, (SIZES, 1, 4, "rehearsal"))
    for outcome in ranks:
        assert outcome["measured"] == [8, 2, 1]
        assert outcome["rows"] == [(4, "failed")]
        assert outcome["reason"] == f"out of memory measuring decode size 4 on rank 1 (free {FREE / GIB:.2f} GiB)"
        assert outcome["failed"].size == 4
    # Each measured size: the agreement, then its forward's collectives (embedding, two per
    # layer, the gather); the failed one only the agreement.
    per_forward = 1 + 2 * 2 + 1
    assert ranks[0]["issued"] == [1 + per_forward, 1, 1 + per_forward, 1 + per_forward]


def test_out_of_memory_measuring_after_a_rehearsal_that_fitted_ends_the_run_with_one_message():
    with pytest.raises(EnvironmentProblem) as caught:
        run_ranks(tp_oom_worker.measure_oom_rank, 2, (SIZES, 1, 4, "measure"))
    assert str(caught.value).startswith(
        f"rank 1: out of memory measuring decode size 4 after its rehearsal fitted (free {FREE / GIB:.2f} GiB)")
    assert "every rank" in caught.value.remedy and "--mem-fraction-static" in caught.value.remedy


def test_tp_forwards_issue_no_collective_inside_the_skip_and_match_tp1_outside():
    ranks = run_ranks(tp_oom_worker.skipped_collectives_rank, 2, ())
    tp1 = tp_worker.extend_then_decode(tp_worker.make_runner("tiny", SINGLE, torch.float32, False), None)
    layers = 2
    for outcome in ranks:
        # Four forwards, each: the embedding's all-reduce, two per layer, the vocabulary gather.
        assert outcome["outside"] == 4 * (1 + 2 * layers + 1)
        assert outcome["inside"] == 0
        assert outcome["skipped_logits_shape"] == (12, 512)  # the whole vocabulary, undefined values
        for got, expected in zip(outcome["logits"], tp1, strict=True):
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_collectives_connect_before_recording_once_per_distinct_row_count():
    # Recording skips eager collectives: without these, NCCL would set up its connections
    # inside a capture, where a peer that ran out of memory never joins.
    for outcome in run_ranks(tp_oom_worker.connect_collectives_rank, 2, ()):
        assert outcome["issued"] == 3  # rows 1, 8 and 16


def test_connect_collectives_at_tp1_issues_none(monkeypatch):
    monkeypatch.setattr(distributed, "all_reduce", lambda x: pytest.fail("a collective at TP=1"))
    distributed.connect_collectives([1, 8], hidden=4, dtype=torch.float32)


def test_every_rank_profiles_as_rank_0_and_the_others_write_to_folders_of_their_own(tmp_path):
    from cgtool.capture.options import CaptureOptions
    from cgtool.capture.tp import rank_options

    opts = CaptureOptions(model="tiny", kinds=("decode",), capture_bs=[1, 2], capture_num_tokens=[],
                          profile=True, tp_size=2, out_dir=tmp_path)
    assert rank_options(opts, 0) is opts
    other = rank_options(opts, 1)
    # A profiled replay holds NCCL collectives: a rank that did not profile would not run it.
    assert other.profile and other.out_dir == tmp_path / "rank1"


def test_all_ranks_at_tp1_is_this_ranks_values():
    assert all_ranks([1, 7, 0]) == [[1, 7, 0]]


def test_the_skip_nests_and_ends_with_its_block():
    with eager_collectives_skipped():
        with eager_collectives_skipped():
            assert distributed._skipped(torch.zeros(1))
        assert distributed._skipped(torch.zeros(1))
    assert not distributed._skipped(torch.zeros(1))


def test_at_tp1_an_out_of_memory_reading_fails_the_size_without_naming_a_rank(monkeypatch):
    state = SessionState()
    reading = per_size.OutOfMemory(free_bytes=FREE, total_bytes=TOTAL, shortfall_bytes=GIB)
    assert not per_size.settle_out_of_memory(state, "decode", 8, None, "capturing")
    assert per_size.settle_out_of_memory(state, "decode", 4, reading, "capturing")
    assert per_size.settle_out_of_memory(state, "decode", 2, reading, "capturing")
    assert [(r.size, r.status) for r in state.sizes] == [(4, "failed"), (2, "failed")]
    assert state.incomplete_reason == "out of memory capturing decode size 4 (free 3.00 GiB)"  # the first
    assert state.failed.shortfall_bytes == GIB


def test_at_tp1_a_rehearsal_is_not_run(monkeypatch):
    rehearsed = []
    state = SessionState()
    assert per_size.measured(state, "decode", 1, lambda: "check", rehearse=lambda: rehearsed.append(1)) == "check"
    assert rehearsed == []


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_gpu_nccl_out_of_memory_on_rank_1_in_capture_warmup_and_rehearsal_fails_those_sizes_only(tmp_path):
    from cgtool.capture.options import CaptureOptions
    from cgtool.documents.results import CaptureReport

    opts = CaptureOptions(model="qwen2.5-0.5b", kinds=("decode",), capture_bs=SIZES, capture_num_tokens=[],
                          random_weights=True, tp_size=2, out_dir=tmp_path, context_len=256)
    report = CaptureReport.from_dict(run_ranks(tp_oom_worker.session_oom_rank_gpu, 2, (opts,)), "report")
    status = {(r.size, r.rank): r.status for r in report.sizes}
    assert status == {(s, rank): ("ok" if s == 1 else "failed") for s in SIZES for rank in (0, 1)}
    assert report.incomplete_reason.startswith("out of memory capturing decode size 8 on rank 1 (free ")


def test_ranks_time_each_path_as_often_as_the_rank_that_asked_most():
    """A rank that issued fewer timed forwards than its peer would leave the peer inside a
    collective: rank 0 asks for 1 and 5 calls, rank 1 for 2 and 4; both issue 2 and 5."""
    ranks = run_ranks(tp_oom_worker.agreed_counts_rank, 2, ())
    assert [outcome["counts"] for outcome in ranks] == [[2, 5], [2, 5]]
