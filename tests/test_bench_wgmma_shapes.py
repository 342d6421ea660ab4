"""benchmarks/bench_wgmma_shapes.py: its forms compile for Hopper, and without a GPU it says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _bench():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import bench_wgmma_shapes
    finally:
        sys.path.remove(str(BENCHMARKS))
    return bench_wgmma_shapes


def test_without_a_gpu_the_benchmark_says_so_in_one_line():
    run = subprocess.run([sys.executable, str(BENCHMARKS / "bench_wgmma_shapes.py"), "--out", "unused.json"],
                         check=False, capture_output=True, text=True, timeout=120, cwd=BENCHMARKS.parent)
    assert run.returncode == 1
    assert run.stderr.strip() == "bench_wgmma_shapes.py needs a Hopper GPU and Triton's Gluon"


def test_a_tile_counts_the_real_heads_multiply_adds():
    bench = _bench()
    scores = 64 * 16 * 576
    output = 512 * 16 * 64
    assert bench.useful_macs("scores_t") == bench.useful_macs("scores_padded") == scores
    assert bench.useful_macs("output_padded") == output
    assert bench.useful_macs("tile_t") == scores + output


# Compiled in a process without TRITON_INTERPRET (which conftest sets without a GPU): under it
# the forms' Gluon helpers are the interpreter's functions, which the compiler refuses.
COMPILE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import bench_wgmma_shapes as bench
from cgtool.runtime.offline_compile import compile_for, resource_usage
if bench.gluon is None:
    print(json.dumps(None))
else:
    form, warps = bench.FORMS[sys.argv[2]]
    compiled = compile_for(bench._mma_shapes, {"FORM": form, "WARPS": warps}, {"Src": "*bf16", "Out": "*fp32"},
                           warps, 1)
    print(json.dumps(resource_usage(compiled)))
"""


@pytest.mark.parametrize("name", ["tile_t", "tile_padded", "tile_t_softmax", "tile_t_stale_max"])
def test_each_form_compiles_for_hopper_without_spilling(name):
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", COMPILE, str(BENCHMARKS), name], env=env, capture_output=True,
                          text=True, timeout=300, check=False, cwd=BENCHMARKS.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    usage = json.loads(done.stdout.strip().splitlines()[-1])
    if usage is None:
        pytest.skip("this Triton has no Gluon")
    assert usage["stack_bytes"] == 0
