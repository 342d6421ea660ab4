"""Planner benchmark: a million synthetic requests through simulation and optimisation.

    .venv/bin/python scripts/bench_plan.py [--requests 1000000] [--rate 10] [--seed 0]

Requests are chat-like (Poisson arrivals; log-normal prompts around 900 tokens and outputs
around 150), generated from a fixed seed, planned for llama-3.1-8b on an H100 with SGLang's
defaults. The target is under 10 s for simulation plus optimisation on a 2-core machine.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from rich.console import Console
from rich.table import Table

from cgtool.config import load_model_config
from cgtool.gpus import gpu_spec
from cgtool.planner.plan import PlanRequest, plan_requests


def synthesise(n: int, rate_per_s: float, seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    arrival_s = np.cumsum(rng.exponential(1 / rate_per_s, n))
    input_len = np.minimum(rng.lognormal(6.8, 0.9, n).astype(np.int64) + 1, 16000)
    output_len = np.minimum(rng.lognormal(5.0, 0.8, n).astype(np.int64) + 1, 2000)
    cached_len = (input_len * rng.uniform(0, 0.5, n)).astype(np.int64)  # shared prefixes
    return arrival_s, input_len, output_len, cached_len


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--rate", type=float, default=10.0, help="mean arrivals per second")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    arrays = synthesise(args.requests, args.rate, args.seed)
    stages: dict[str, float] = {}
    marks = {"start": time.perf_counter()}

    def progress(stage: str, fraction: float) -> None:
        if stage == "optimise" and fraction == 0.0:
            marks["optimise"] = time.perf_counter()

    request = PlanRequest(
        load_model_config("llama-3.1-8b"), gpu_spec("H100-80GB"), trace_name="synthetic"
    )
    plan = plan_requests(*arrays, request, progress)
    end = time.perf_counter()
    stages["simulation (incl. setup)"] = marks["optimise"] - marks["start"]
    stages["optimisation, memory, scoring"] = end - marks["optimise"]
    stages["total"] = end - marks["start"]

    console = Console()
    sim = plan.simulation
    rows = {row.schedule: row for row in plan.comparison}
    table = Table(
        title=f"cgtool plan: {args.requests:,} requests, {args.rate:g}/s, seed {args.seed}"
    )
    table.add_column("")
    table.add_column("", justify="right")
    for name, seconds in stages.items():
        table.add_row(name, f"{seconds:.2f} s")
    table.add_row("simulated steps", f"{sim['steps']:,}")
    table.add_row("simulated duration", f"{sim['duration_s']:,.0f} s")
    table.add_row("requests per wall second", f"{args.requests / stages['total']:,.0f}")
    table.add_row(
        "plan: graphs / step", f"{rows['plan'].num_graphs} / {rows['plan'].expected_step_ms:.3f} ms"
    )
    table.add_row(
        "default: graphs / step",
        f"{rows['default'].num_graphs} / {rows['default'].expected_step_ms:.3f} ms",
    )
    console.print(table)


if __name__ == "__main__":
    main()
