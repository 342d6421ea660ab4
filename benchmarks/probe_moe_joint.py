"""Issue 33: the gate/up GEMM's whole tiles as two products or one (`tma_grouped_mm(joint_gate_up=True)`).

The gate/up GEMM (gathering, qwen3-30b-a3b's shape: 128 experts, K 2,048, width 768) with every
expert given the same rows, 256 (two whole blocks), 264 (three, the last nearly empty) and 384
(three), and with rows drawn within 16 of 256 and of 512. Each a replayed CUDA graph of six
GEMMs over distinct weights, us a GEMM, alternating rounds; `same bits` compares every setting's
output with the first's. In calls 2-6 of benchmarks/results/h200-h100-2026-11-27-moe-joint it
was probe_moe_ride.py (to 2b652db) and its joint settings were named pair*; it also timed an
expert's last rows riding on its last whole block (`ride`).

    python3 benchmarks/probe_moe_joint.py --out joint.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
from bench_moe_mla import graph_us, log  # benchmarks/ is the script's path

from cgtool.model.moe_tma_gemm import tma_grouped_mm

EXPERTS, HIDDEN, WIDTH, TOP_K, LAYERS = 128, 2048, 768, 8, 6
SETTINGS = {"whole": {"joint_gate_up": False}, "whole_3_stages": {"joint_gate_up": False, "num_stages": 3},
            "joint": {"joint_gate_up": True}, "joint_3_stages": {"joint_gate_up": True, "num_stages": 3}}


def inputs(rows: str, gen: torch.Generator) -> tuple:
    """(ends, tokens, order, pair weights) for `rows` rows an expert, or with "~" (as "~256")
    rows drawn uniformly within 16 of it."""
    if rows.startswith("~"):
        counts = torch.randint(int(rows[1:]) - 16, int(rows[1:]) + 17, (EXPERTS,), generator=gen, device="cuda")
    else:
        counts = torch.full((EXPERTS,), int(rows), device="cuda")
    ends = counts.cumsum(0).int()
    pairs = int(ends[-1])
    tokens = torch.randn(pairs // TOP_K + 1, HIDDEN, generator=gen, device="cuda").bfloat16()
    order = torch.randperm(pairs, generator=gen, device="cuda").int()
    return ends, tokens, order, torch.rand(pairs, generator=gen, device="cuda")


def gemms(data: tuple, opts: dict, weights: list[torch.Tensor]):
    ends, tokens, order, pair_weights = data
    return lambda: [tma_grouped_mm(tokens, w, ends, gated=True, pair_weights=pair_weights, order=order,
                                   gather_top_k=TOP_K, tile_order=1, **opts) for w in weights]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--rows", default="256,264,384,~256,~512")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    weights = [(torch.randn(EXPERTS, 2 * WIDTH, HIDDEN, generator=gen, device="cuda") * HIDDEN**-0.5).bfloat16()
               for _ in range(LAYERS)]
    result = {"device": torch.cuda.get_device_name(), "rows": {}}
    for rows_each in args.rows.split(","):
        data = inputs(rows_each, gen)
        fns = {name: gemms(data, opts, weights) for name, opts in SETTINGS.items()}
        same = all(torch.equal(fn()[0], fns["whole"]()[0]) for fn in fns.values())
        timed = {name: [] for name in fns}
        for _ in range(args.rounds):
            for name, fn in fns.items():
                timed[name].append(graph_us(fn) / LAYERS)
        result["rows"][rows_each] = {"same_bits": same, **{name: statistics.median(t) for name, t in timed.items()},
                                     "rounds": timed}
        log(f"rows {rows_each}: " + " ".join(f"{n} {statistics.median(t):.1f}" for n, t in timed.items())
            + f" same bits {same}")
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
