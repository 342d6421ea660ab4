"""Time writing and reading a synthetic cgtool trace (default: one million requests).

    python benchmarks/bench_trace_io.py [NUM_REQUESTS]

The requests are random (seed 0): Poisson arrivals at 100 req/s, prompts 1-8,000 tokens,
outputs 0-1,000 tokens.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from cgtool.traces.trace import read_trace, request_trace, write_trace


def main() -> None:
    num_requests = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    rng = np.random.default_rng(0)
    input_len = rng.integers(1, 8001, num_requests)
    trace = request_trace(
        "bench",
        np.cumsum(rng.exponential(0.01, num_requests)),
        input_len,
        rng.integers(0, 1001, num_requests),
        rng.integers(0, input_len),
    )
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "bench.jsonl"
        start = time.perf_counter()
        write_trace(trace, path)
        write_s = time.perf_counter() - start
        start = time.perf_counter()
        again = read_trace(path)
        read_s = time.perf_counter() - start
        size_mib = path.stat().st_size / (1 << 20)
    assert len(again) == num_requests
    print(
        f"{num_requests:,} requests ({size_mib:.0f} MiB): write {write_s:.2f} s, read {read_s:.2f} s"
    )


if __name__ == "__main__":
    main()
