"""The margin's named parts against the raw figures they come from (H100 80GB HBM3,
2026-11-26, benchmarks/results/h100-2026-11-26-memory); the files are read, not copied."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cgtool.planner import margin
from cgtool.planner.cost import kernels_per_forward
from cgtool.planner.memory_terms import GRAPH_NODE_BYTES, family
from cgtool.specs.config import load_model_config

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks/results/h100-2026-11-26-memory"
CALLS = [json.loads((RESULTS / f"parts-call{n}.json").read_text()) for n in (1, 3)]
MIB = 1 << 20


@pytest.mark.parametrize("call", CALLS, ids=["call1", "call3"])
def test_device_parts_match_both_measurements(call):
    device = call["device"]
    assert margin.CUDA_CONTEXT_BYTES == pytest.approx(device["cuda_context_bytes"], abs=MIB)
    workspaces = device["cublas_workspace_bytes"] + device["cublas_side_stream_bytes"]
    assert margin.CUBLAS_WORKSPACE_BYTES == pytest.approx(workspaces, abs=MIB)


@pytest.mark.parametrize("case", sorted(CALLS[0]["device"]["sampler_peak_bytes"]))
def test_sampler_bytes_a_logit_cover_every_measured_peak(case):
    rows, vocab = map(int, case.split("x"))
    peak = CALLS[0]["device"]["sampler_peak_bytes"][case]
    assert margin.SAMPLER_BYTES_PER_LOGIT * rows * vocab >= peak
    assert margin.SAMPLER_BYTES_PER_LOGIT * rows * vocab == pytest.approx(peak, rel=0.02)


def test_fragmentation_share_covers_the_worst_measured_extend():
    shares = [(e["reserved_growth_bytes"] - e["activation_bytes"]) / e["activation_bytes"]
              for m in CALLS[1]["models"] for e in m["extend"].values()]
    assert margin.FRAGMENTATION_SHARE >= max(shares)
    assert margin.FRAGMENTATION_SHARE == pytest.approx(max(shares), abs=0.01)


def test_first_forward_covers_what_each_familys_first_capture_paid_beyond_its_graphs():
    # The proofs run on today's kernels; the MLA kernels of the first runs loaded 0.6 GiB more.
    paid: dict[str, list[float]] = {}
    for path in (RESULTS.parent / "h100-2026-11-26-memory-proof").glob("*/verify.json"):
        result = json.loads(path.read_text())
        cfg = load_model_config(result["model"]["name"])
        plan = next(s for s in result["sets"] if s["name"] == "plan")
        graphs = len(plan["capture_bs"]) + len(plan["capture_num_tokens"])
        objects = graphs * kernels_per_forward(cfg) * GRAPH_NODE_BYTES
        paid.setdefault(family(cfg), []).append(plan["graph_bytes"] - result["proof"]["graph_bytes"] - objects)
    assert set(paid) == {"dense", "MoE", "MLA"}
    for name, figures in paid.items():
        assert margin.FIRST_FORWARD_BYTES[name] >= max(figures)
        assert margin.FIRST_FORWARD_BYTES[name] <= max(figures) + 16 * MIB


def test_nccl_is_a_part_only_with_tensor_parallelism():
    cfg = load_model_config("llama-3.1-8b")
    assert "nccl" not in margin.named_margin(cfg, 256, 1 << 30)
    assert margin.named_margin(cfg, 256, 1 << 30, tp_size=4)["nccl"] == 4 * margin.COMM_RESERVE_BYTES_PER_RANK
    assert set(margin.SOURCES) >= set(margin.named_margin(cfg, 256, 1 << 30, tp_size=4))
