"""The replay loop on the GPU: decode steps pad to the captured sizes, extend steps use the
piecewise graphs up to their largest size, eager beyond; decisions stay the policy's."""

import bisect

import pytest
import torch

from cgtool.replay.policy import Scheduler
from cgtool.replay.run import prepare
from cgtool.replay.session import build_bench, capture_graphs, replay_once
from cgtool.specs.gpus import gpu_spec

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_gpu_replay_pads_to_captured_sizes_and_follows_the_policy(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(
        f'{{"arrival": {0.004 * i}, "input_len": {30 + 37 * (i % 7)}, "output_len": {3 + 5 * (i % 4)}}}\n'
        for i in range(24)))
    inputs = prepare(trace, default=True, model="qwen2.5-0.5b", gpu=gpu_spec("H100-80GB"), device="cuda",
                     chunked_prefill_size=256, max_running_requests=12, max_total_tokens=20_000)
    bench = build_bench(inputs)
    graphs = capture_graphs(bench, [1, 2, 4, 8], [64, 128], lambda _: None)
    result = replay_once(inputs, bench, graphs, lambda _: None)
    assert result.status == "complete"
    assert all(f is not None for f in result.requests.finish_ms)
    steps = result.steps
    for kind, size, padded in zip(steps.kind, steps.size, steps.padded):
        captured = [1, 2, 4, 8] if kind == "decode" else [64, 128]
        expected = captured[bisect.bisect_left(captured, size)] if size <= captured[-1] else 0
        assert padded == expected, (kind, size, padded)
    assert any(p == 0 for p in steps.padded) and any(p > 0 for p in steps.padded)
    again = Scheduler(inputs.reqs, 12, 256, result.settings.kv_tokens)
    for kind, size, start in zip(steps.kind, steps.size, steps.start_ms):
        step = again.next_step(start)
        assert step is not None and (step.kind, step.size) == (kind, size)
    assert result.predictions[0].policy_agrees
