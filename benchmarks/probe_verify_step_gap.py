"""Issue 33: why `verify`'s decode steps run 2-4% longer than a capture's replays of the same sizes.

On one H200 (2026-11-28, calls 6-7 of benchmarks/results/h200-h100-2026-11-28-mla-small-batches)
deepseek-v2-lite's captured decode graphs replayed within -3.2% to +1.3% of the cost model's
prediction, and `verify`'s steps of the same sizes measured 130-330 us longer. A capture replays
one graph back to back over requests whose rows lie together in a small pool; a `verify` step
copies the batch's inputs in first (`DecodeGraphRunner.replay`), follows a step of another size,
and its requests' rows lie far apart in a pool of millions of slots (`verify.session.spread_requests`).
This takes those apart in one process, over one set of captured graphs and one large pool:

- `replay`: the graph alone, back to back, its inputs loaded once (a capture's `replay_ms`);
- `step`: `replay(batch)`, inputs copied in each time, back to back;
- `copies`: the inputs' copies alone;
- `sequence`: `replay(batch)` of every size in turn, each timed from the end of the one before
  (as `verify` times its steps);
- `idle`: `replay(batch)` launched onto an idle GPU (a synchronize before each), so the host's
  launch shows, as after a step the host issued slower than the GPU ran it;
- `after_extend`: `replay(batch)` right after an eager extend of `--extend-tokens` tokens, timed
  from the extend's end (a sixth of `verify`'s sampled steps are extends, in shuffled order);

each with the requests' rows `packed` (as capture allocates them) and `spread` (as verify maps
them), in alternating rounds.

    python3 benchmarks/probe_verify_step_gap.py --out gap.json [--bs 1,2,4,8,16] [--context 1024]
        [--mem-fraction 0.85] [--layers N] [--extend-tokens 4096] [--modes replay,step,...]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import statistics
import sys
import time
from collections.abc import Callable

import bench_moe_mla as timing
import torch

from cgtool.capture.workbench import build_workbench
from cgtool.runners.decode import DecodeGraphRunner
from cgtool.specs.config import load_model_config
from cgtool.verify.session import spread_requests

ROUNDS, REPLAYS, PAIRS = 5, 20, 5


def events_ms(fns: list, repeat: int = 1) -> list[float]:
    """Each call's ms, timed from the end of the call before it (one event between calls)."""
    calls = fns * repeat
    events = [torch.cuda.Event(enable_timing=True) for _ in range(len(calls) + 1)]
    torch.cuda.synchronize()
    events[0].record()
    for fn, end in zip(calls, events[1:], strict=True):
        fn()
        end.record()
    torch.cuda.synchronize()
    return [a.elapsed_time(b) for a, b in itertools.pairwise(events)]


MODES = ("replay", "step", "copies", "sequence", "idle", "after_extend")


def time_mode(mode: str, runner: DecodeGraphRunner, bs: int, batch: object, extend: Callable[[], object]) -> float:
    """One mode's mean ms at one size (all but `sequence`, which runs every size)."""
    step = functools.partial(runner.replay, batch)
    if mode == "replay":
        return timing.replay_us(runner.graphs[bs], REPLAYS) / 1e3
    if mode == "step":
        return statistics.mean(events_ms([step], REPLAYS))
    if mode == "copies":
        return statistics.mean(events_ms([functools.partial(runner.load_inputs, batch)], REPLAYS))
    if mode == "idle":
        return statistics.mean(events_ms([step])[0] for _ in range(REPLAYS))
    return statistics.mean(events_ms([extend, step], PAIRS)[1::2])


def one_round(runner: DecodeGraphRunner, batches: dict[int, object], extend: Callable[[], object],
              modes: tuple[str, ...]) -> dict[str, dict[int, float]]:
    """Each mode's ms at every size, once."""
    found: dict[str, dict[int, float]] = {mode: {} for mode in modes}
    for bs, batch in batches.items():
        runner.load_inputs(batch)
        for mode in modes:
            if mode != "sequence":
                found[mode][bs] = time_mode(mode, runner, bs, batch, extend)
    if "sequence" in modes:
        fns = [functools.partial(runner.replay, batch) for batch in batches.values()]
        for bs, ms in zip(batches, events_ms(fns), strict=True):
            found["sequence"][bs] = ms
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", default="deepseek-v2-lite")
    parser.add_argument("--bs", default="1,2,4,8,16")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--mem-fraction", type=float, default=0.85, help="the KV pool's share, as verify's plan gives it")
    parser.add_argument("--layers", type=int, help="fewer layers than the model's (a quicker run)")
    parser.add_argument("--modes", default=",".join(MODES), help="which of " + ", ".join(MODES))
    parser.add_argument("--extend-tokens", type=int, default=4096, help="the eager extend before `after_extend`")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("probe_verify_step_gap.py needs a GPU")
    sizes = sorted(int(v) for v in args.bs.split(","))
    modes = tuple(m for m in MODES if m in args.modes.split(","))
    cfg = load_model_config(args.model)
    if args.layers:
        cfg = dataclasses.replace(cfg, num_layers=args.layers)
    bench = build_workbench(cfg, weights_dir=None, dtype=torch.bfloat16, mem_fraction_static=args.mem_fraction,
                            max_bs=sizes[-1], max_tokens=args.extend_tokens, context_len=args.context, seed=0)
    pool = bench.runner.kv_pool
    timing.log(f"{args.model}: {cfg.num_layers} layers, context {args.context}, pool {bench.kv_tokens:,} slots")
    runner = DecodeGraphRunner(bench.runner, sizes)
    runner.capture()
    packed = pool.req_to_token.clone()
    spread_requests(pool, seed=0)
    spread = pool.req_to_token.clone()
    layouts = {"packed": packed, "spread": spread}
    batches = {}
    for name, table in layouts.items():
        pool.req_to_token.copy_(table)
        batches[name] = {bs: bench.decode_batch(bs) for bs in sizes}
    model = bench.runner.model
    extend_batch = bench.extend_batch(args.extend_tokens)

    def extend() -> object:
        return model.compute_logits(bench.runner.forward_eager(extend_batch)[-1:])

    rounds: dict[str, list] = {name: [] for name in layouts}
    for _ in range(ROUNDS):
        for name, table in layouts.items():
            pool.req_to_token.copy_(table)
            rounds[name].append(one_round(runner, batches[name], extend, modes))
    result = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
              "torch": torch.__version__, "model": args.model, "layers": cfg.num_layers, "context": args.context,
              "kv_slots": bench.kv_tokens, "rounds": ROUNDS, "replays": REPLAYS, "pairs": PAIRS,
              "extend_tokens": args.extend_tokens, "layouts": {}}
    for name in layouts:
        result["layouts"][name] = {
            mode: {bs: statistics.median(r[mode][bs] for r in rounds[name]) for bs in sizes}
            for mode in modes}
    timing.save_results(result, args.out)
    for bs in sizes:
        timing.log(f"bs {bs}: " + "; ".join(
            f"{name} " + " ".join(f"{mode} {m[mode][bs]:.3f}" for mode in modes) + " ms"
            for name, m in result["layouts"].items()))


if __name__ == "__main__":
    main()
