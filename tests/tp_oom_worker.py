"""Rank functions for tests/test_tp_out_of_memory.py: one rank of TP=2 runs out of memory on
the CPU (gloo), spawned by cgtool.capture.launch.run_ranks.

The capture path runs as it does on a GPU, with the few CUDA calls that have no CPU meaning
replaced by stand-ins: a "graph capture" runs its forward once more, eagerly; memory reads
give fixed figures. Collectives are counted by wrapping the functions cgtool calls.
"""

from __future__ import annotations

from datetime import timedelta
from functools import partial

import torch
import torch.distributed as dist
from tp_worker import PROMPTS, extend_then_decode, make_runner

from cgtool.capture import per_size
from cgtool.capture.measure import CaptureCost, ReplayCheck
from cgtool.capture.options import CaptureOptions, SessionState
from cgtool.capture.sampling import PathTiming, SpreadPool
from cgtool.runners import graphs, piecewise_backend
from cgtool.runtime import distributed
from cgtool.runtime.distributed import (
    current_tp,
    eager_collectives_skipped,
    gather_to_rank0,
    init_tensor_parallel,
)
from cgtool.runtime.engine import extend_batch

GIB = 1 << 30
FREE, TOTAL = 3 * GIB, 80 * GIB  # what the stand-in mem_get_info reads on every rank
OOM_TEXT = "CUDA out of memory. Tried to allocate 1.50 GiB."
# A collective left without its peer fails the test in a minute instead of hanging for 30.
TIMEOUT = timedelta(seconds=60)


class _NoStream:
    def wait_stream(self, stream: object) -> None:
        pass


def _record_eagerly(forward, stream) -> graphs.RecordedGraph:
    return graphs.RecordedGraph(graph="cpu stand-in", output=forward(), kernels=None)


def _measure_without_cuda(record, pool) -> CaptureCost:
    record()
    return CaptureCost(capture_s=0.0, retained_bytes=0, peak_bytes=0, non_torch_bytes=0)


def _join(rank: int, size: int, init_method: str) -> list[int]:
    """Join the group with CPU stand-ins for CUDA; returns the count of collectives issued."""
    torch.set_num_threads(1)  # two ranks on a small CI machine: no oversubscribed cores
    init_tensor_parallel(rank, size, init_method, torch.device("cpu"), timeout=TIMEOUT)
    torch.cuda.current_stream = lambda device=None: _NoStream()
    torch.cuda.mem_get_info = lambda device=None: (FREE, TOTAL)
    graphs.record_graph = _record_eagerly  # decode's warm_and_record
    piecewise_backend.record_graph = _record_eagerly  # each piece's capture
    per_size.measure_capture = _measure_without_cuda
    count = [0]

    def counted(fn):
        def call(*args, **kwargs):
            count[0] += 1
            return fn(*args, **kwargs)
        return call

    # cgtool.runtime.distributed looks dist.all_reduce up at each call; its gather is bound at import.
    dist.all_reduce = counted(dist.all_reduce)
    distributed._all_gather_single = counted(distributed._all_gather_single)
    return count


def _run_out_of_memory(module: torch.nn.Module, when) -> None:
    """`module` raises torch's out-of-memory error on entry whenever `when(*args)` holds."""
    forward = module.forward

    def forward_or_oom(*args, **kwargs):
        if when(*args):
            raise torch.OutOfMemoryError(OOM_TEXT)
        return forward(*args, **kwargs)

    module.forward = forward_or_oom


def _counted_records(runner, count: list[int]) -> list[int]:
    """Collectives issued inside each of the runner's records, whether it fails or not."""
    issued: list[int] = []
    record = runner._record

    def counted_record(size: int) -> None:
        before = count[0]
        try:
            record(size)
        finally:
            issued.append(count[0] - before)

    runner._record = counted_record
    return issued


def record_oom_rank(rank: int, size: int, init_method: str, channel, kind: str, sizes: list[int],
                    fail_rank: int, fail_at: int) -> None:
    """`capture_each_size` over the tiny model's real runner of `kind`; rank `fail_rank` runs
    out of memory part-way through the forward of size `fail_at`. Every rank's outcome, on
    rank 0."""
    from cgtool.runners.decode import DecodeGraphRunner
    from cgtool.runners.piecewise import PiecewiseGraphRunner

    count = _join(rank, size, init_method)
    model_runner = make_runner("tiny", current_tp(), torch.float32, weights=False)
    if kind == "decode":
        runner = DecodeGraphRunner(model_runner, sizes)
        # Rank 0 goes on past the last layer: its all-reduces, then the vocabulary gather.
        _run_out_of_memory(model_runner.model.model.layers[-1], partial(_has_rows, rank == fail_rank, fail_at))
    else:
        runner = PiecewiseGraphRunner(model_runner, sizes)
        runner.warmup()  # compiled, as the session does, before the sizes are recorded
        pieces = runner.backend.pieces  # rank 0 goes on through the all-reduces between the rest
        _run_out_of_memory(pieces[len(pieces) // 2], lambda *args: rank == fail_rank and (
            piecewise_backend._graph_num_tokens == fail_at))
    issued = _counted_records(runner, count)
    state = SessionState()
    opts = CaptureOptions(model="tiny", kinds=(kind,), capture_bs=sizes, capture_num_tokens=sizes)
    costs = per_size.capture_each_size(kind, runner, sizes, None, lambda event: None, state, opts)
    outcome = {
        "costs": sorted(costs), "rows": [(r.size, r.status) for r in state.sizes],
        "reason": state.incomplete_reason, "failed": state.failed, "issued": issued,
        "replayable": runner.captured_bs if kind == "decode" else runner.captured_num_tokens,
        "kept_alive": len(runner.retired_graphs) if kind == "decode" else sum(
            fail_at in piece.graphs for piece in runner.backend.pieces),
    }
    _send_all(channel, outcome)


def _has_rows(failing: bool, rows: int, positions: torch.Tensor, *args) -> bool:
    return failing and positions.shape[0] == rows


def _send_all(channel, outcome: dict) -> None:
    gathered = gather_to_rank0(outcome)
    if gathered is not None:
        channel.result(gathered)


def measure_oom_rank(rank: int, size: int, init_method: str, channel, sizes: list[int],
                     fail_rank: int, fail_at: int, fail_in: str) -> None:
    """Decode sizes measured through `per_size.measured`, as capture/kinds.py does, with the
    runner's eager forward as the rehearsal; rank `fail_rank` runs out of memory at `fail_at`
    in the rehearsal or (`fail_in="measure"`) in the measurement after it."""
    from cgtool.runners.decode import DecodeGraphRunner

    count = _join(rank, size, init_method)
    model_runner = make_runner("tiny", current_tp(), torch.float32, weights=False)
    runner = DecodeGraphRunner(model_runner, sizes)
    failing = rank == fail_rank
    if fail_in == "rehearsal":
        _run_out_of_memory(model_runner.model.model.layers[-1], partial(_has_rows, failing, fail_at))
    state, measured, issued = SessionState(), [], []
    for bs in reversed(sizes):
        eager = partial(runner.eager_outputs, runner.static_batch(bs))
        out_of_memory = failing and fail_in == "measure" and bs == fail_at
        before = count[0]
        check = per_size.measured(state, "decode", bs, partial(_check_eagerly, eager, out_of_memory),
                                  rehearse=eager)
        issued.append(count[0] - before)
        if check is not None:
            measured.append(bs)
    _send_all(channel, {"measured": measured, "rows": [(r.size, r.status) for r in state.sizes],
                        "reason": state.incomplete_reason, "failed": state.failed, "issued": issued})


def _check_eagerly(eager, out_of_memory: bool) -> ReplayCheck:
    """The measurement's eager forward, with real collectives; no replay on the CPU."""
    eager()
    if out_of_memory:
        raise torch.OutOfMemoryError(OOM_TEXT)
    timing = PathTiming((1.0,), "short", SpreadPool())
    return ReplayCheck(eager=timing, replay=timing, max_abs_diff=0.0, tolerance=1.0,
                       worst_output=0, worst_token=0)


def skipped_collectives_rank(rank: int, size: int, init_method: str, channel) -> None:
    """Logits of `extend_then_decode` with real collectives, then collectives issued by the
    same forwards (eager, and the compiled piecewise body) inside `eager_collectives_skipped`."""
    from cgtool.runners.piecewise import PiecewiseGraphRunner

    count = _join(rank, size, init_method)
    logits = extend_then_decode(make_runner("tiny", current_tp(), torch.float32, weights=False), None)
    outside = count[0]
    runner = make_runner("tiny", current_tp(), torch.float32, weights=False)
    piecewise = PiecewiseGraphRunner(runner, capture_num_tokens=[16])
    piecewise.warmup()  # compiled with real collectives, as the session compiles
    row = runner.kv_pool.alloc_request(12)[0]
    batch = extend_batch(runner.kv_pool, [row], [0], [PROMPTS[1] + PROMPTS[2]])
    before = count[0]
    with eager_collectives_skipped():
        extend_then_decode(runner, None)
        skipped_logits = runner.model.compute_logits(piecewise.forward_compiled(batch))
    _send_all(channel, {"logits": logits, "outside": outside, "inside": count[0] - before,
                        "skipped_logits_shape": tuple(skipped_logits.shape)})


# ------------------------------------------------------------------ GPU (NCCL), two ranks


def session_oom_rank_gpu(rank: int, size: int, init_method: str, channel, opts: CaptureOptions) -> None:
    """A whole decode capture session (run_capture) on rank `rank`'s GPU. Rank 1 runs out of
    memory inside the capture of bs 8 (rank 0 records its graph, NCCL included), in the first
    warm-up of bs 4, and in the measuring rehearsal of bs 2; bs 1 fits everywhere."""
    from cgtool.capture.session import run_capture
    from cgtool.runners.decode import DecodeGraphRunner

    init_tensor_parallel(rank, size, init_method, torch.device("cuda", rank), timeout=TIMEOUT)
    if rank == 1:
        record, eager = DecodeGraphRunner._forward_into_logits, DecodeGraphRunner.eager_outputs
        warmed: set[int] = set()

        def record_or_oom(self, batch):
            bs, capturing = batch.batch_size, torch.cuda.is_current_stream_capturing()
            if (bs == 8 and capturing) or (bs == 4 and bs not in warmed):
                warmed.add(bs)
                raise torch.OutOfMemoryError(OOM_TEXT)
            return record(self, batch)

        def eager_or_oom(self, batch):
            if batch.batch_size == 2 and distributed._skip_eager:
                raise torch.OutOfMemoryError(OOM_TEXT)
            return eager(self, batch)

        DecodeGraphRunner._forward_into_logits = record_or_oom
        DecodeGraphRunner.eager_outputs = eager_or_oom
    report = run_capture(opts, channel.progress, SessionState())
    if rank == 0:
        channel.result(report.to_dict())


def connect_collectives_rank(rank: int, size: int, init_method: str, channel) -> None:
    """Collectives `connect_collectives` issues for rows [1, 8, 8, 16] of a 4-wide hidden
    state, and what the all-reduce left (zeros summed are zeros)."""
    count = _join(rank, size, init_method)
    from cgtool.runtime.distributed import connect_collectives

    connect_collectives([1, 8, 8, 16], hidden=4, dtype=torch.float32)
    _send_all(channel, {"issued": count[0]})


def agreed_counts_rank(rank: int, size: int, init_method: str, channel) -> None:
    """Each rank asks for its own numbers of timed calls (measure.check_replay's agreement)."""
    from cgtool.capture import measure

    _join(rank, size, init_method)
    _send_all(channel, {"counts": measure._agreed_most([rank + 1, 5 - rank])})
