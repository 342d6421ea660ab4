"""Issue 33: MLA decode's stage 1 as the store's programmatic dependent, in a whole model.

The step's store of the new latent rows (kv_store) releases the attention after it at once,
and the Gluon stage 1, launched as its dependent, waits for it (gluon_mla): the stage's launch
overlaps the store. This times what a user replays: deepseek-v2-lite's (random weights)
decode graphs at each batch size, captured once that way and once with both launched as
before (the store releasing nothing, stage 1 an ordinary launch; the merge kernel and the MoE
layers as shipped either way), replayed in alternating rounds over the same inputs. Both must
give the same logits bit for bit.

    python3 benchmarks/bench_mla_dependent.py --out dependent.json [--bs 1,16,32,48,64] [--context 1024]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import bench_moe_mla as timing
import torch

from cgtool.attention import gluon_mla
from cgtool.capture.workbench import build_workbench
from cgtool.runners.decode import DecodeGraphRunner
from cgtool.runtime import kv_store
from cgtool.specs.config import load_model_config

ROUNDS, REPLAYS = 7, 20


def captured(bench, sizes: list[int], dependent: bool) -> DecodeGraphRunner:
    """Graphs captured with stage 1 and the store launched as shipped, or (`dependent` False)
    both ordinary launches."""
    shipped = gluon_mla.dependent_launch, kv_store.dependent_launch
    if not dependent:
        gluon_mla.dependent_launch = kv_store.dependent_launch = lambda device: {"PDL": False}
    try:
        runner = DecodeGraphRunner(bench.runner, sizes)
        runner.capture()
    finally:
        gluon_mla.dependent_launch, kv_store.dependent_launch = shipped
    return runner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", default="deepseek-v2-lite")
    parser.add_argument("--bs", default="1,16,32,48,64")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--layers", type=int, help="fewer layers than the model's (a quicker run)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_mla_dependent.py needs a GPU")
    sizes = sorted(int(v) for v in args.bs.split(","))
    cfg = load_model_config(args.model)
    if args.layers:
        cfg = dataclasses.replace(cfg, num_layers=args.layers)
    bench = build_workbench(cfg, weights_dir=None, dtype=torch.bfloat16, mem_fraction_static=0.5,
                            max_bs=sizes[-1], max_tokens=64, context_len=args.context, seed=0,
                            kv_tokens=sizes[-1] * (args.context + 1) + 256)
    timing.log(f"{args.model}: {cfg.num_layers} layers, context {args.context}, gluon {gluon_mla.available(torch.device('cuda'))}")
    runners = {"ordinary": captured(bench, sizes, False), "dependent": captured(bench, sizes, True)}
    result = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
              "torch": torch.__version__, "model": args.model, "layers": cfg.num_layers, "context": args.context,
              "rounds": ROUNDS, "replays": REPLAYS, "sizes": []}
    for bs in sizes:
        batch = bench.decode_batch(bs)
        logits = {name: runner.replay(batch).clone() for name, runner in runners.items()}
        same = bool(torch.equal(logits["ordinary"], logits["dependent"]))
        times: dict[str, list[float]] = {name: [] for name in runners}
        for _ in range(ROUNDS):
            for name, runner in runners.items():
                runner.load_inputs(batch)
                times[name].append(timing.replay_us(runner.graphs[bs], REPLAYS) / 1e3)
        row = {"bs": bs, "same_logits": same, **{f"{name}_ms": sorted(t)[ROUNDS // 2] for name, t in times.items()},
               **{f"{name}_rounds_ms": t for name, t in times.items()}}
        row["dependent_vs_ordinary"] = row["dependent_ms"] / row["ordinary_ms"]
        row["saved_per_layer_us"] = (row["ordinary_ms"] - row["dependent_ms"]) * 1e3 / cfg.num_layers
        result["sizes"].append(row)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        timing.log(f"bs {bs}: ordinary {row['ordinary_ms']:.3f} ms, dependent {row['dependent_ms']:.3f} ms "
            f"({row['dependent_vs_ordinary']:.3f}x, {row['saved_per_layer_us']:.2f} us a layer), same logits {same}")


if __name__ == "__main__":
    main()
