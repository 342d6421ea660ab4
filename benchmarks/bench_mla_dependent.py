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

import json
import time

import bench_moe_mla as timing
import torch
from bench_mla_step_settings import step_arguments, step_workbench

from cgtool.attention import gluon_mla
from cgtool.runners.decode import DecodeGraphRunner
from cgtool.runtime import kv_store

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
    args = step_arguments(__doc__.split("\n")[0], "1,16,32,48,64").parse_args()
    bench, cfg, sizes = step_workbench(args, "bench_mla_dependent.py")
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
