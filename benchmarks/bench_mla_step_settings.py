"""Issue 33: settings of MLA decode's kernels timed in whole decode steps, not layers alone.

`probe_mla_projection.py` times graphs of MLA layers (the store, stage 1 and the projection);
a user replays whole steps, where the MoE layers, norms and projections sit between them and
may hide or add to a layer's gain. This captures deepseek-v2-lite's decode graphs (random
weights) at each batch size once as shipped and once under each setting (constants of
`mla_merge_projection`, or with "wg." of `gluon_mla_wgmma`, set while capturing), then replays
them in alternating rounds over the same inputs. Each setting's logits are compared with the
shipped graphs'.

    python3 benchmarks/bench_mla_step_settings.py --out step.json --settings "tr:GLUON_KERNEL=0"
        [--bs 8,16,24,32,48,64] [--context 1024] [--layers N]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any

import bench_moe_mla as timing
import torch
from probe_mla_projection import parse_settings, set_to

from cgtool.attention import gluon_mla
from cgtool.capture.workbench import build_workbench
from cgtool.runners.decode import DecodeGraphRunner
from cgtool.specs.config import load_model_config

ROUNDS, REPLAYS = 7, 20


def captured(bench, sizes: list[int], values: dict[str, int]) -> DecodeGraphRunner:
    """Decode graphs of `sizes` captured with `values` set (none: as shipped)."""
    with set_to(values):
        runner = DecodeGraphRunner(bench.runner, sizes)
        runner.capture()
    return runner


def size_row(bench, runners: dict[str, DecodeGraphRunner], bs: int, layers: int) -> dict:
    """One batch size's median step over ROUNDS alternating rounds of each capture, and each
    setting's logits against the shipped graphs'."""
    batch = bench.decode_batch(bs)
    logits = {name: runner.replay(batch).float().clone() for name, runner in runners.items()}
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(ROUNDS):
        for name, runner in runners.items():
            runner.load_inputs(batch)
            times[name].append(timing.replay_us(runner.graphs[bs], REPLAYS) / 1e3)
    ms = {name: sorted(t)[ROUNDS // 2] for name, t in times.items()}
    row = {"bs": bs, "ms": ms, "rounds_ms": times}
    row["vs_shipped"] = {name: ms[name] / ms["shipped"] for name in runners if name != "shipped"}
    row["shipped_shorter_per_layer_us"] = {name: (ms[name] - ms["shipped"]) * 1e3 / layers
                                           for name in runners if name != "shipped"}
    row["max_abs_logit_diff_vs_shipped"] = {name: float((logits[name] - logits["shipped"]).abs().max())
                                            for name in runners if name != "shipped"}
    return row


def step_arguments(description: str, bs: str) -> argparse.ArgumentParser:
    """The arguments of a whole-step benchmark: --out, --model, --bs (default `bs`), --context, --layers."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", default="deepseek-v2-lite")
    parser.add_argument("--bs", default=bs)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--layers", type=int, help="fewer layers than the model's (a quicker run)")
    return parser


def step_workbench(args: argparse.Namespace, script: str) -> tuple[Any, Any, list[int]]:
    """(workbench, model config, batch sizes) for `args` of `step_arguments`: the model with
    random weights and a KV pool for every size at the context; exits where no GPU runs."""
    if not torch.cuda.is_available():
        sys.exit(f"{script} needs a GPU")
    sizes = sorted(int(v) for v in args.bs.split(","))
    cfg = load_model_config(args.model)
    if args.layers:
        cfg = dataclasses.replace(cfg, num_layers=args.layers)
    bench = build_workbench(cfg, weights_dir=None, dtype=torch.bfloat16, mem_fraction_static=0.5,
                            max_bs=sizes[-1], max_tokens=64, context_len=args.context, seed=0,
                            kv_tokens=sizes[-1] * (args.context + 1) + 256)
    timing.log(f"{args.model}: {cfg.num_layers} layers, context {args.context}, "
               f"gluon {gluon_mla.available(torch.device('cuda'))}")
    return bench, cfg, sizes


def main() -> None:
    parser = step_arguments(__doc__.split("\n")[0], "8,16,24,32,48,64")
    parser.add_argument("--settings", required=True, help="NAME:CONST=V[,CONST=V];...")
    args = parser.parse_args()
    bench, cfg, sizes = step_workbench(args, "bench_mla_step_settings.py")
    settings = {name.removeprefix("fused_"): values for name, values in parse_settings(args.settings).items()}
    runners = {"shipped": captured(bench, sizes, {})}
    for name, values in settings.items():
        runners[name] = captured(bench, sizes, values)
    result = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
              "torch": torch.__version__, "model": args.model, "layers": cfg.num_layers, "context": args.context,
              "settings": settings, "rounds": ROUNDS, "replays": REPLAYS, "sizes": []}
    for bs in sizes:
        row = size_row(bench, runners, bs, cfg.num_layers)
        result["sizes"].append(row)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        timing.log(f"bs {bs} x {args.context}: shipped {row['ms']['shipped']:.3f} ms; " + "; ".join(
            f"{name} {row['ms'][name]:.3f} ({row['vs_shipped'][name]:.4f}x, "
            f"{row['shipped_shorter_per_layer_us'][name]:+.2f} us a layer, "
            f"|logits - shipped| {row['max_abs_logit_diff_vs_shipped'][name]:.3g})" for name in settings))


if __name__ == "__main__":
    main()
