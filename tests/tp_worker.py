"""Rank functions for the tensor-parallel tests: run by cgtool.capture.launch.run_ranks in spawned processes.

Each builds the rank's share of a model on the CPU (gloo) and returns what the test compares
against one process at TP=1.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from cgtool.attention import make_backend
from cgtool.errors import EnvironmentProblem
from cgtool.model.loader import build_model
from cgtool.model.parallel import local_config
from cgtool.runtime.distributed import TensorParallel, barrier, current_tp, init_tensor_parallel
from cgtool.runtime.engine import ModelRunner, decode_batch, extend_batch
from cgtool.runtime.kv import KVPool
from cgtool.specs.config import ModelConfig, load_model_config

PROMPTS = [[5, 17, 3, 44, 9, 21, 60], [8, 2, 71, 33, 90, 4, 12, 6, 1], [30, 11, 7]]
PREFIX_LENS = [0, 5, 0]  # the second request reuses a cached 5-token prefix
DECODE_STEPS = [[3, 14, 15], [92, 65, 35]]


def make_runner(model: str, tp: TensorParallel, dtype: torch.dtype, weights: bool) -> ModelRunner:
    """Weights from the folder `model`, or random weights (seed 0) of its shapes."""
    cfg = load_model_config(model)
    folder = Path(model) if weights else None
    net = build_model(cfg, device="cpu", dtype=dtype, max_positions=64, weights_dir=folder, tp=tp)
    local = local_config(cfg, tp)
    pool = KVPool(local, num_slots=256, max_reqs=8, max_context_len=64, dtype=dtype, device="cpu")
    return ModelRunner(net, pool, make_backend("torch", local.num_heads, local.head_dim))


def extend_then_decode(runner: ModelRunner, cfg: ModelConfig) -> list[torch.Tensor]:
    """Logits of a prefix warm-up, an extend batch of three requests, then two decode steps."""
    pool, model = runner.kv_pool, runner.model
    rows = [pool.alloc_request(len(p) + len(DECODE_STEPS))[0] for p in PROMPTS]
    out = [model.compute_logits(runner.forward_eager(extend_batch(pool, [rows[1]], [0], [PROMPTS[1][:5]])))]
    new = [p[c:] for p, c in zip(PROMPTS, PREFIX_LENS)]
    out.append(model.compute_logits(runner.forward_eager(extend_batch(pool, rows, PREFIX_LENS, new))))
    lens = [len(p) for p in PROMPTS]
    for ids in DECODE_STEPS:
        out.append(model.compute_logits(runner.forward_eager(decode_batch(pool, rows, lens, ids))))
        lens = [n + 1 for n in lens]
    return out


def logits_rank(rank: int, size: int, init_method: str, channel, cases: list) -> None:
    """For each (model, dtype, weights) case: this rank's logits of `extend_then_decode`."""
    torch.set_num_threads(1)  # two ranks on a small CI machine: no oversubscribed cores
    init_tensor_parallel(rank, size, init_method, torch.device("cpu"))
    results = []
    for model, dtype, weights in cases:
        runner = make_runner(model, current_tp(), dtype, weights)
        results.append(extend_then_decode(runner, load_model_config(model)))
    channel.result(results)


def gather_rank(rank: int, size: int, init_method: str, channel) -> None:
    """Each rank's vocabulary slice holds its own rank number: the gather puts them in order."""
    from cgtool.runtime.distributed import gather_vocab

    init_tensor_parallel(rank, size, init_method, torch.device("cpu"))
    local = torch.full((2, 3), float(rank)) + torch.arange(3.0)  # shard 3, vocab 5: 1 pad row
    channel.result(gather_vocab(local, vocab_size=5))


def failing_rank(rank: int, size: int, init_method: str, channel) -> None:
    """Rank 1 fails with a clear error while rank 0 waits for it in a collective forever."""
    init_tensor_parallel(rank, size, init_method, torch.device("cpu"))
    if rank == 1:
        time.sleep(0.5)
        raise EnvironmentProblem("the test's rank 1 has no GPU memory left", "Lower --max-bs.")
    while True:
        barrier()


def crashing_rank(rank: int, size: int, init_method: str, channel) -> None:
    if rank == 1:
        raise ValueError("an unexpected bug\nwith a second line")
    channel.progress("started")
    time.sleep(60)


def piecewise_rank(rank: int, size: int, init_method: str, channel) -> None:
    """The compiled, split body at TP=2 (no graphs on the CPU): pieces and logits vs eager."""
    from cgtool.runners.piecewise import PiecewiseGraphRunner

    torch.set_num_threads(1)
    init_tensor_parallel(rank, size, init_method, torch.device("cpu"))
    runner = make_runner("tiny", current_tp(), torch.float32, weights=False)
    piecewise = PiecewiseGraphRunner(runner, capture_num_tokens=[16])
    piecewise.warmup()
    row = runner.kv_pool.alloc_request(12)[0]
    batch = extend_batch(runner.kv_pool, [row], [0], [PROMPTS[1] + PROMPTS[2]])
    compiled = runner.model.compute_logits(piecewise.forward_compiled(batch))
    split = piecewise.backend.split
    channel.result({
        "compiled": compiled,
        "eager": runner.model.compute_logits(runner.forward_eager(batch)),
        "pieces": len(split.pieces),
        "capturable": len(split.capturable_pieces),
    })


# ------------------------------------------------------------------ GPU (NCCL), two ranks


def _barrier_then_record(index: int, size: int, record) -> bool:
    barrier()  # as capture/kinds.py does: every rank records the same size together
    record()
    return True


def _diff(got: torch.Tensor, expected: torch.Tensor) -> dict:
    return {"max_abs_diff": float((got.float() - expected.float()).abs().max()),
            "scale": float(expected.float().abs().max()),
            "argmax_agree": float((got.argmax(-1) == expected.argmax(-1)).float().mean())}


def parity_rank_gpu(rank: int, size: int, init_method: str, channel, preset: str,
                    capture_bs: list[int], capture_tokens: list[int]) -> None:
    """TP=2 decode and piecewise graphs, every replay compared on rank 0 with TP=1 eager."""
    import faulthandler
    import sys

    from cgtool.capture.workbench import build_workbench
    from cgtool.runners.decode import DecodeGraphRunner
    from cgtool.runners.piecewise import PiecewiseGraphRunner

    # A collective that never matches hangs: leave every thread's stack in the log first.
    faulthandler.dump_traceback_later(float(os.environ.get("CGTOOL_TP_TEST_STACKS_S", "600")))
    start = time.monotonic()

    def stage(name: str) -> None:
        print(f"rank {rank} {time.monotonic() - start:7.1f} s {name}", file=sys.stderr, flush=True)

    init_tensor_parallel(rank, size, init_method, torch.device("cuda", rank))
    cfg = load_model_config(preset)
    kwargs = {"weights_dir": None, "dtype": torch.bfloat16, "mem_fraction_static": 0.5,
              "max_bs": max(capture_bs), "max_tokens": max(capture_tokens), "context_len": 128,
              "seed": 0, "kv_tokens": 8192}
    bench = build_workbench(cfg, **kwargs, tp=current_tp())
    ref = build_workbench(cfg, **kwargs) if rank == 0 else None  # TP=1, the same weights and cache
    stage("built")
    decode = DecodeGraphRunner(bench.runner, capture_bs)
    decode.capture(_barrier_then_record)
    results = {}
    for bs in sorted({*capture_bs, *(b - 1 for b in capture_bs if b > 2)}):  # padded sizes too
        got = decode.replay(bench.decode_batch(bs)).clone()
        own_eager = bench.runner.model.compute_logits(bench.runner.forward_eager(bench.decode_batch(bs)))
        if ref is not None:
            expected = ref.runner.model.compute_logits(ref.runner.forward_eager(ref.decode_batch(bs)))
            results[("decode", bs)] = _diff(got, expected) | {"vs_own_eager": _diff(got, own_eager)}
    stage("decode checked")
    piecewise = PiecewiseGraphRunner(bench.runner, capture_tokens)
    piecewise.warmup()
    stage("compiled")
    piecewise.capture(_barrier_then_record)
    stage("piecewise captured")
    for n in sorted({*capture_tokens, max(capture_tokens) - 7}):
        model = bench.runner.model
        got = model.compute_logits(piecewise.replay(bench.extend_batch(n))[-1:]).clone()
        if ref is not None:
            expected = ref.runner.model.compute_logits(ref.runner.forward_eager(ref.extend_batch(n))[-1:])
            results[("piecewise", n)] = _diff(got, expected)
    stage("piecewise checked")
    results["replays"] = (decode.replay_count, piecewise.replay_count)
    results["pieces"] = len(piecewise.backend.split.capturable_pieces)
    channel.result(results)


def interrupted_rank(rank: int, size: int, init_method: str, channel) -> None:
    """Measures 'sizes' until the coordinator stops it, then sends what it has, as
    cgtool.capture.tp does with its partial report."""
    init_tensor_parallel(rank, size, init_method, torch.device("cpu"))
    measured: list[int] = []
    try:
        measured.append(0)
        # Both ranks have measured and are inside this try before rank 0 tells the coordinator,
        # which stops them on that. With the barrier before the try, rank 1 once sent nothing
        # (a fresh clone on two cores, 2026-11-28): a stop that reaches it still leaving the
        # barrier lands outside the try.
        barrier()
        channel.progress("measuring")
        for size_done in range(1, 10_000):
            measured.append(size_done)
            time.sleep(0.01)
    except KeyboardInterrupt:
        channel.partial({"rank": rank, "measured": len(measured) > 0})
        raise
