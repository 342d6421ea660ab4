"""The sizes loop on out-of-memory, without a GPU: the runner's loop is real, the capture of
one size is replaced by a fake."""

from __future__ import annotations

import torch

from cgtool.capture import per_size
from cgtool.capture.measure import CaptureCost
from cgtool.capture.memory import oom_request_bytes
from cgtool.capture.options import CaptureOptions, SessionState
from cgtool.runners.decode import DecodeGraphRunner
from cgtool.specs.config import load_model_config

GIB = 1 << 30
OOM_TEXT = "CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of 79.19 GiB"


class _CpuModelRunner:
    """Enough of ModelRunner to build a DecodeGraphRunner's buffers on the CPU."""

    def __init__(self):
        self.model = type("M", (), {"cfg": load_model_config("tiny")})()
        self.device = torch.device("cpu")


def _run_loop(monkeypatch, fits_up_to: int, sizes: list[int]) -> tuple[SessionState, dict, list[int]]:
    attempted: list[int] = []

    def record(size: int) -> None:
        attempted.append(size)
        if size > fits_up_to:
            raise torch.OutOfMemoryError(OOM_TEXT)

    def fake_measure(fn, pool):
        fn()
        return CaptureCost(capture_s=0.1, retained_bytes=1, peak_bytes=2, non_torch_bytes=0)

    monkeypatch.setattr(per_size, "measure_capture", fake_measure)
    monkeypatch.setattr(per_size, "report_progress", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (3 * GIB, 80 * GIB))
    state = SessionState()
    opts = CaptureOptions(model="tiny", kinds=("decode",), capture_bs=sizes, capture_num_tokens=[])
    runner = DecodeGraphRunner(_CpuModelRunner(), sizes)
    monkeypatch.setattr(runner, "_record", record)
    costs = per_size.capture_each_size("decode", runner, runner.capture_bs, None, None, state, opts)
    return state, costs, attempted


def test_sizes_too_large_fail_and_smaller_ones_are_still_captured(monkeypatch):
    state, costs, attempted = _run_loop(monkeypatch, fits_up_to=16, sizes=[1, 2, 4, 8, 16, 32, 64])
    assert attempted == [64, 32, 16, 8, 4, 2, 1]  # largest first, as SGLang captures
    assert sorted(costs) == [1, 2, 4, 8, 16]
    assert [(r.size, r.status) for r in state.sizes] == [(64, "failed"), (32, "failed")]
    assert state.failed is not None and state.failed.size == 64  # the first failure is named
    assert state.failed.shortfall_bytes == int(1.5 * GIB)
    assert state.failed.free_bytes == 3 * GIB and state.failed.total_bytes == 80 * GIB
    assert state.incomplete_reason == "out of memory capturing decode size 64 (free 3.00 GiB)"


def test_everything_fits_leaves_the_session_complete(monkeypatch):
    state, costs, _ = _run_loop(monkeypatch, fits_up_to=1000, sizes=[1, 8, 64])
    assert sorted(costs) == [1, 8, 64]
    assert state.failed is None and state.incomplete_reason is None and state.sizes == []


def test_the_failed_allocation_size_is_read_from_pytorch_message():
    assert oom_request_bytes(OOM_TEXT) == int(1.5 * GIB)
    assert oom_request_bytes("Tried to allocate 20.00 MiB") == 20 << 20
    assert oom_request_bytes("some other allocator error") == 0


def test_phase_times_add_up_and_an_interruption_names_the_innermost_phase():
    state = SessionState()
    with state.phase("capture"):
        pass
    with state.phase("capture"):
        pass
    try:
        with state.phase("measure"), state.phase("profile"):
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    assert set(state.phase_s) == {"capture", "measure", "profile"}
    assert all(seconds >= 0 for seconds in state.phase_s.values())
    assert state.stopped_in == "profile"


def test_options_hold_each_kinds_sizes_once_ascending_and_drop_kinds_not_captured():
    opts = CaptureOptions(model="tiny", kinds=("decode",), capture_bs=[8, 1, 8, 4],
                          capture_num_tokens=[64, 16])
    assert opts.capture_bs == [1, 4, 8] and opts.capture_num_tokens == []


def test_options_refuse_a_size_below_one_naming_the_flag():
    import pytest

    from cgtool.errors import EnvironmentProblem

    with pytest.raises(EnvironmentProblem, match="decode: capture sizes must be positive") as info:
        CaptureOptions(model="tiny", kinds=("decode",), capture_bs=[0, 4], capture_num_tokens=[])
    assert info.value.remedy == "Fix --bs."


def test_a_recapture_upward_runs_through_the_same_sizes_loop(monkeypatch):
    from functools import partial

    from cgtool.specs.hidden_states import HiddenMode

    recorded = []
    monkeypatch.setattr(per_size, "measure_capture", lambda fn, pool: (fn(), CaptureCost(0.1, 1, 2, 0))[1])
    monkeypatch.setattr(per_size, "report_progress", lambda *a: None)
    state = SessionState()
    opts = CaptureOptions(model="tiny", kinds=("decode",), capture_bs=[1, 2], capture_num_tokens=[])
    runner = DecodeGraphRunner(_CpuModelRunner(), [1, 2])

    def record(bs):
        recorded.append((runner.hidden_mode.name, bs))
        runner.graphs[bs] = object()

    monkeypatch.setattr(runner, "_record", record)
    per_size.capture_each_size("decode", runner, runner.capture_bs, None, None, state, opts)
    costs = per_size.capture_each_size("decode", runner, runner.capture_bs, None, None, state, opts,
                                         record_all=partial(runner.recapture, HiddenMode.FULL))
    assert recorded == [("NULL", 2), ("NULL", 1), ("FULL", 2), ("FULL", 1)]
    assert sorted(costs) == [1, 2] and len(runner.retired_graphs) == 2


def test_a_size_out_of_memory_on_recapture_fails_as_that_modes_row(monkeypatch):
    from functools import partial

    from cgtool.specs.hidden_states import HiddenMode

    monkeypatch.setattr(per_size, "measure_capture", lambda fn, pool: (fn(), CaptureCost(0.1, 1, 2, 0))[1])
    monkeypatch.setattr(per_size, "report_progress", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (3 * GIB, 80 * GIB))
    state = SessionState()
    opts = CaptureOptions(model="tiny", kinds=("decode",), capture_bs=[1, 2], capture_num_tokens=[])
    runner = DecodeGraphRunner(_CpuModelRunner(), [1, 2])

    def record(bs):
        if runner.hidden_mode is HiddenMode.FULL and bs == 2:
            raise torch.OutOfMemoryError(OOM_TEXT)
        runner.graphs[bs] = object()

    monkeypatch.setattr(runner, "_record", record)
    per_size.capture_each_size("decode", runner, runner.capture_bs, None, None, state, opts,
                                 record_all=partial(runner.recapture, HiddenMode.FULL))
    assert [(r.size, r.status, r.hidden_mode) for r in state.sizes] == [(2, "failed", "full")]


def _counting(monkeypatch, profiled: dict[int, int]) -> list[list[int]]:
    """Stands in for the profiler with `profiled` counts; returns the sizes of each pass."""
    passes: list[list[int]] = []

    def fake(calls):
        passes.append([size for size, _, _ in calls])
        return {size: profiled[size] for size, _, _ in calls}

    monkeypatch.setattr(per_size, "_profiled_counts", fake)
    return passes


CALLS = [(size, None, None) for size in (64, 16, 8)]  # largest first, as measured


def test_kernels_run_outside_the_graphs_are_profiled_at_two_sizes_and_added(monkeypatch):
    passes = _counting(monkeypatch, {64: 350, 8: 360})
    counts = per_size._counts_from_graphs(CALLS, {64: 300, 16: 305, 8: 310})
    assert passes == [[64, 8]]
    assert counts == {64: 350, 16: 355, 8: 360}


def test_probes_that_disagree_on_the_eager_kernels_profile_every_size(monkeypatch):
    passes = _counting(monkeypatch, {64: 350, 16: 356, 8: 361})
    counts = per_size._counts_from_graphs(CALLS, {64: 300, 16: 305, 8: 310})
    assert passes == [[64, 8], [64, 16, 8]]
    assert counts == {64: 350, 16: 356, 8: 361}


def test_a_graph_that_cannot_be_read_falls_back_to_the_profiler(monkeypatch):
    passes = _counting(monkeypatch, {64: 350, 16: 355, 8: 360})
    counts = per_size._counts_from_graphs(CALLS, {64: 300, 16: None, 8: 310})
    assert passes == [[64, 16, 8]] and counts[16] == 355


def test_kernel_counts_wait_for_the_end_of_the_session_with_the_graphs_counts_of_their_time(monkeypatch):
    """No profiler may run before every size is measured (CUPTI would slow what follows);
    the graphs' own counts are read when the kind finishes, before a recapture changes them."""
    passes = _counting(monkeypatch, {64: 350, 8: 360})
    monkeypatch.setattr(per_size, "report_progress", lambda *args: None)
    state = SessionState()
    state.sizes = [per_size._failed_row("decode", size) for size in (64, 16, 8)]
    for row in state.sizes:
        row.status = "ok"
    graph_counts = {64: 300, 16: 305, 8: 310}
    opts = CaptureOptions(model="tiny", kinds=("decode",), capture_bs=[8, 16, 64], capture_num_tokens=[])
    per_size.count_kernels(state, "decode", CALLS, opts, None, graph_counts.get)
    graph_counts.update({64: 0, 16: 0, 8: 0})  # a recapture replaced the graphs
    assert passes == [] and [r.kernels_per_forward for r in state.sizes] == [0, 0, 0]
    per_size.run_kernel_counts(state)
    assert passes == [[64, 8]] and [r.kernels_per_forward for r in state.sizes] == [350, 355, 360]
    assert state.pending_kernel_counts == [] and "profile" in state.phase_s


def _timed(pools, samples: tuple[float, ...], regime: str = "short"):
    from cgtool.capture.measure import ReplayCheck
    from cgtool.capture.sampling import PathTiming

    replay_pool, eager_pool = pools.pool("replay", regime), pools.pool("eager", regime)
    replay_pool.add(samples)
    eager_pool.add([s * 3 for s in samples])
    return ReplayCheck(
        eager=PathTiming(tuple(s * 3 for s in samples), regime, eager_pool),
        replay=PathTiming(samples, regime, replay_pool),
        max_abs_diff=0.0, tolerance=1.0, worst_output=0, worst_token=0,
    )


def test_rows_leave_the_measure_loop_with_the_interval_of_the_whole_pool():
    """The first size alone has one degree of freedom (t 12.7); twenty sizes more restate its
    interval from the pooled spread, even when the loop is cut short by a signal."""
    cost = CaptureCost(capture_s=0.1, retained_bytes=0, peak_bytes=0, non_torch_bytes=0)
    state = SessionState()
    try:
        with per_size.timed_sizes(state, "decode") as pools:
            per_size.record_size(state, "decode", 1, cost, _timed(pools, (6.0, 6.3)), 5.0)
            first_ci = state.sizes[0].replay_ci95_ms
            for bs in range(2, 22):
                per_size.record_size(state, "decode", bs, cost, _timed(pools, (7.0, 7.0 * 1.05)), 5.0)
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    row = state.sizes[0]
    pooled = pools.pool("replay", "short")
    assert row.replay_ci95_ms == pooled.ci95_ms(6.15, 2) and row.replay_ci95_ms < first_ci / 4
    assert row.replay_samples == 2
    spread = state.sample_spread["decode:replay:short"]
    assert spread.dof == 21 and spread.rel_sd == pooled.rel_sd
    assert set(state.sample_spread) == {"decode:replay:short", "decode:eager:short"}


def test_the_eager_warm_up_runs_once_with_collectives_skipped_and_survives_running_out(monkeypatch):
    from cgtool.runtime import distributed

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (3 * GIB, 80 * GIB))
    seen = []

    def forward():
        seen.append(distributed._skip_eager)
        raise torch.OutOfMemoryError(OOM_TEXT)

    per_size.warm_eager(forward)  # no error: the size's own measurement will report it
    assert seen == [True] and distributed._skip_eager is False
