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

each with the requests' rows `packed` (as capture allocates them) and `spread` (as verify maps
them), in alternating rounds.

    python3 benchmarks/probe_verify_step_gap.py --out gap.json [--bs 1,2,4,8,16] [--context 1024]
        [--mem-fraction 0.85] [--layers N]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import statistics
import sys
import time

import bench_moe_mla as timing
import torch

from cgtool.capture.workbench import build_workbench
from cgtool.runners.decode import DecodeGraphRunner
from cgtool.specs.config import load_model_config
from cgtool.verify.session import spread_requests

ROUNDS, REPLAYS = 5, 20


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


def one_round(runner: DecodeGraphRunner, batches: dict[int, object]) -> dict[str, dict[int, float]]:
    """Every mode's ms at every size, once."""
    found: dict[str, dict[int, float]] = {"replay": {}, "step": {}, "copies": {}, "sequence": {}}
    for bs, batch in batches.items():
        runner.load_inputs(batch)
        found["replay"][bs] = timing.replay_us(runner.graphs[bs], REPLAYS) / 1e3
        found["step"][bs] = statistics.mean(events_ms([lambda b=batch: runner.replay(b)], REPLAYS))
        found["copies"][bs] = statistics.mean(events_ms([lambda b=batch: runner.load_inputs(b)], REPLAYS))
    fns = [lambda b=batch: runner.replay(b) for batch in batches.values()]
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
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("probe_verify_step_gap.py needs a GPU")
    sizes = sorted(int(v) for v in args.bs.split(","))
    cfg = load_model_config(args.model)
    if args.layers:
        cfg = dataclasses.replace(cfg, num_layers=args.layers)
    bench = build_workbench(cfg, weights_dir=None, dtype=torch.bfloat16, mem_fraction_static=args.mem_fraction,
                            max_bs=sizes[-1], max_tokens=64, context_len=args.context, seed=0)
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
    rounds: dict[str, list] = {name: [] for name in layouts}
    for _ in range(ROUNDS):
        for name, table in layouts.items():
            pool.req_to_token.copy_(table)
            rounds[name].append(one_round(runner, batches[name]))
    result = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
              "torch": torch.__version__, "model": args.model, "layers": cfg.num_layers, "context": args.context,
              "kv_slots": bench.kv_tokens, "rounds": ROUNDS, "replays": REPLAYS, "layouts": {}}
    for name in layouts:
        result["layouts"][name] = {
            mode: {bs: statistics.median(r[mode][bs] for r in rounds[name]) for bs in sizes}
            for mode in ("replay", "step", "copies", "sequence")}
    timing.save_results(result, args.out)
    for bs in sizes:
        timing.log(f"bs {bs}: " + "; ".join(
            f"{name} replay {m['replay'][bs]:.3f} step {m['step'][bs]:.3f} copies {m['copies'][bs]:.3f} "
            f"sequence {m['sequence'][bs]:.3f} ms" for name, m in result["layouts"].items()))


if __name__ == "__main__":
    main()
