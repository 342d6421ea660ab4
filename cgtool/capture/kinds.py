"""Each graph kind's session: its runner captures the sizes, then each is verified and timed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from cgtool.attention import redone_chunks
from cgtool.capture.measure import CaptureCost, check_replay
from cgtool.capture.options import (
    CaptureOptions,
    ProgressCallback,
    SessionState,
)
from cgtool.capture.per_size import (
    MeasuredCall,
    capture_each_size,
    count_kernels,
    measured,
    measuring,
    peak_flops,
    record_size,
    report_progress,
    sglang_mem_usage,
    timed_sizes,
    warm_eager,
)
from cgtool.capture.timing import host_launch_ms, plain_torch_host_us
from cgtool.capture.workbench import Workbench
from cgtool.model.moe import count_active_experts
from cgtool.units import BF16_BYTES

if TYPE_CHECKING:
    from cgtool.runners.decode import DecodeGraphRunner


def capture_decode(
    bench: Workbench, opts: CaptureOptions, pool: Any, bandwidth: float, on_progress: ProgressCallback,
    state: SessionState,
) -> None:
    """Capture at the first hidden-state mode, then recapture at each higher one as the
    runtime does; every mode's sizes get their own rows."""
    from cgtool.runners.decode import DecodeGraphRunner

    first, *upward = opts.hidden_modes
    if redone_chunks.counted(bench.runner):
        redone_chunks.reset(bench.runner.device)  # made here, outside any graph, before they take its address
    runner = DecodeGraphRunner(bench.runner, opts.capture_bs, opts.enable_cudagraph_gc, hidden_mode=first)
    state.runners.append(runner)  # graphs must outlive the session: they share one pool
    with state.phase("capture"), sglang_mem_usage(state, "decode"):
        costs = capture_each_size("decode", runner, runner.capture_bs, pool, on_progress, state, opts)
    calls = _measure_decode(bench, runner, costs, bandwidth, on_progress, state, opts)
    if calls:
        with measuring(state):
            state.eager_host_ms = host_launch_ms(min(calls, key=lambda c: c[0])[2])  # the smallest batch
            state.plain_torch_host_us = plain_torch_host_us(bench.runner.device)
    count_kernels(state, "decode", calls, opts, on_progress, runner.graph_kernels, first.flag)
    for mode in upward:
        with state.phase("capture"), sglang_mem_usage(state, f"decode:{mode.flag}"):
            costs = capture_each_size("decode", runner, runner.capture_bs, pool, on_progress, state,
                                   opts, record_all=partial(runner.recapture, mode))
        calls = _measure_decode(bench, runner, costs, bandwidth, on_progress, state, opts)
        # Tables and traces go with the first mode's rows; profiled at the session's end,
        # they show the graphs live then (the last mode's: one copy more per graph).
        count_kernels(state, "decode", calls, replace(opts, profile=False), on_progress, runner.graph_kernels,
                      mode.flag)


def _measure_decode(
    bench: Workbench, runner: DecodeGraphRunner, costs: dict[int, CaptureCost], bandwidth: float,
    on_progress: ProgressCallback, state: SessionState, opts: CaptureOptions,
) -> list[MeasuredCall]:
    """Replay against eager on every output of the runner's mode (logits, hidden states)."""
    calls = []
    mode = runner.hidden_mode.flag
    label = "decode" if mode == "null" else f"decode/{mode}"
    with timed_sizes(state, label) as pools:
        if costs:
            warm_eager(partial(runner.eager_outputs, bench.decode_batch(max(costs))))
        # Smallest first, as piecewise: the seeding calls go to the cheapest sizes (bs 1-4:
        # 15 ms for both paths against 43 ms at bs 256 with llama-3.1-8b on the H100).
        for i, (bs, cost) in enumerate(sorted(costs.items())):
            report_progress(on_progress, "decode", "measure", bs, i, len(costs))
            batch = bench.decode_batch(bs)
            eager = partial(runner.eager_outputs, batch)
            replay = partial(runner.replay_outputs, batch)
            check = measured(state, "decode", bs, partial(
                check_replay, eager=eager, replay=replay, dtype=opts.dtype, pools=pools,
            ), mode, rehearse=eager)
            if check is None:
                continue
            kv_read = bs * (bench.context_len + 1) * bench.cfg.kv_bytes_per_token(BF16_BYTES)
            roofline_ms = (_weights_read(bench, bs) + kv_read) / bandwidth * 1e3
            record_size(state, "decode", bs, cost, check, roofline_ms, mode, _experts_active(bench, eager),
                        _chunks_redone(bench, replay))
            calls.append((bs, replay, eager))
    return calls


def _experts_active(bench: Workbench, eager: Callable[[], object]) -> float | None:
    """Distinct experts a MoE layer routed this batch to, averaged over the MoE layers: one
    more eager forward, with counting on (it syncs, so it stays out of the timed calls)."""
    if bench.cfg.moe is None:
        return None
    with count_active_experts(bench.runner.model) as counts:
        eager()
    return sum(counts) / len(counts) if counts else None


def _chunks_redone(bench: Workbench, replay: Callable[[], object]) -> int | None:
    """MLA decode chunks done twice in one more replay, all layers (their scores outside stage
    1's fixed maximum's range: on a user's weights, the cost of a second stage 1 there); None
    for other models and where the kernel that counts them does not serve."""
    if not redone_chunks.counted(bench.runner):
        return None
    redone_chunks.reset(bench.runner.device)
    replay()
    return redone_chunks.read(bench.runner.device)


def _weights_read(bench: Workbench, tokens: int) -> float:
    """Weight bytes a forward over `tokens` rows streams on this rank: all it holds for a dense
    model; for a MoE model the experts that many tokens are expected to reach."""
    if bench.cfg.moe is None:
        return float(bench.weights_bytes)
    return float(bench.cfg.weight_bytes_read(tokens))


def capture_piecewise(
    bench: Workbench, opts: CaptureOptions, pool: Any, bandwidth: float, on_progress: ProgressCallback,
    state: SessionState,
) -> None:
    runner = _prefill_runner(bench, opts, on_progress, state)
    with state.phase("capture"), sglang_mem_usage(state, "piecewise"):
        costs = capture_each_size(
            "piecewise", runner, runner.capture_num_tokens, pool, on_progress, state, opts
        )
    model = bench.runner.model
    calls = []
    with timed_sizes(state, "piecewise") as pools:
        if costs:
            largest = bench.extend_batch(max(costs))
            warm_eager(partial(_with_last_logits, model, partial(bench.runner.forward_eager, largest)))
        # Smallest first, unlike capture: the first long sizes seed their pool with a second
        # call each (sampling.py), and the smallest long ones cost a third of the largest
        # (llama-3.1-8b: 30-45 ms against 94-104 ms a call on the H100).
        for i, (n, cost) in enumerate(sorted(costs.items())):
            report_progress(on_progress, "piecewise", "measure", n, i, len(costs))
            batch = bench.extend_batch(n)
            eager = partial(bench.runner.forward_eager, batch)
            replay = partial(runner.replay, batch)
            # Compared on every token's final hidden state and the last token's logits; timed
            # as a server runs prefill, to the last token's logits.
            compared_eager = partial(_with_last_logits, model, eager)
            check = measured(state, "piecewise", n, partial(
                check_replay,
                eager=compared_eager,
                replay=partial(_with_last_logits, model, replay),
                dtype=opts.dtype,
                pools=pools,
                timed_eager=lambda f=eager: model.compute_logits(f()[-1:]),
                timed_replay=lambda f=replay: model.compute_logits(f()[-1:]),
            ), rehearse=compared_eager)
            if check is None:
                continue
            flops = 2 * bench.cfg.active_param_count() * n  # each token through its own experts
            bytes_ms = _weights_read(bench, n) / bandwidth * 1e3
            peak = peak_flops()
            roofline_ms = max(bytes_ms, flops / peak * 1e3) if peak else bytes_ms
            record_size(state, "piecewise", n, cost, check, roofline_ms)
            calls.append((n, replay, eager))
    count_kernels(state, "piecewise", calls, opts, on_progress, runner.graph_kernels)


def _prefill_runner(
    bench: Workbench, opts: CaptureOptions, on_progress: ProgressCallback, state: SessionState
) -> Any:
    """The prefill runner of --prefill-backend, built and warmed up. Its rows keep the kind
    "piecewise" (prefill graphs per token count); the report's settings name the backend."""
    from cgtool.capture.prefill_backend import prefill_runner
    from cgtool.runners.compile_cache import default_cache_dir

    report_progress(on_progress, "piecewise", "compile", None, 0, len(opts.capture_num_tokens))
    runner: Any
    if opts.prefill_backend == "breakable":
        runner = prefill_runner("breakable", bench.runner, opts.capture_num_tokens, opts.enable_cudagraph_gc)
        state.runners.append(runner)
        with state.phase("warmup"):  # one eager forward; nothing is compiled
            runner.warmup()
        return runner
    with state.phase("compile"):  # building the runner imports dynamo: seconds, part of compiling
        runner = prefill_runner(
            "piecewise", bench.runner, opts.capture_num_tokens, opts.enable_cudagraph_gc,
            compiler=opts.compiler, compile_cache_dir=default_cache_dir() if opts.compile_cache else None,
        )
        state.runners.append(runner)
        runner.warmup()
        state.compile_cache = runner.compile_cache
    return runner


def _with_last_logits(model: Any, forward: Callable[[], torch.Tensor]) -> list[torch.Tensor]:
    hidden = forward()  # [num_tokens, hidden]
    return [hidden, model.compute_logits(hidden[-1:])]
