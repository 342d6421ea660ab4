"""plan.json as a typed Plan: what the planner returns is what load_plan reads back."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cgtool.commands.main import app
from cgtool.documents.plan_document import PLAN_VERSION, Plan, write_plan
from cgtool.documents.results import load_plan
from cgtool.errors import InputError
from cgtool.planner.plan import plan_batches, plan_requests
from cgtool.planner.request import PlanRequest
from cgtool.specs.config import load_model_config
from cgtool.specs.gpus import gpu_spec

ROOT = Path(__file__).resolve().parents[1]
OLD_PLAN = ROOT / "tests" / "data" / "reports" / "plan-llama-3.1-8b" / "plan.json"
# Plans written by earlier versions (tests/data/plans) and by the benchmark runs the docs cite.
# Packed ones (plan.json.xz, scripts/compact_results.py --pack) are read unpacked.
BENCHMARK_PLANS = sorted((ROOT / "tests" / "data" / "plans").glob("*.json")) + sorted(
    (ROOT / "benchmarks" / "results").rglob("plan*.json")) + sorted(
    (ROOT / "benchmarks" / "results").rglob("plan*.json.xz"))
REQUEST = PlanRequest(load_model_config("llama-3.1-8b"), gpu_spec("H100-80GB"), trace_name="t")


@pytest.fixture(scope="module")
def fresh() -> Plan:
    rng = np.random.default_rng(0)
    n = 1500
    arrival = np.cumsum(rng.exponential(1 / 6.0, n))
    prompt, output = rng.integers(100, 3000, n), rng.integers(20, 600, n)
    return plan_requests(arrival, prompt, output, None, REQUEST)


def _raw(path: Path) -> dict:
    return json.loads(lzma.decompress(path.read_bytes()) if path.suffix == ".xz" else path.read_text())


def test_a_fresh_plan_round_trips_through_plan_json_exactly(fresh, tmp_path):
    write_plan(fresh, tmp_path / "plan.json")
    again = load_plan(tmp_path)
    assert again == fresh
    assert again.to_dict() == fresh.to_dict() == _raw(tmp_path / "plan.json")


def test_a_batch_plan_round_trips_and_writes_no_empty_simulation_fields(fresh, tmp_path):
    d, p = fresh.decode.histogram, fresh.piecewise.histogram
    batch = plan_batches(d.sizes, d.counts, p.sizes, p.counts, REQUEST)
    write_plan(batch, tmp_path / "plan.json")
    assert load_plan(tmp_path) == batch
    assert "loads" not in _raw(tmp_path / "plan.json")["simulation"]


@pytest.mark.parametrize("path", BENCHMARK_PLANS, ids=lambda p: p.name)
def test_recorded_benchmark_plans_load_and_write_back_unchanged(path):
    data = _raw(path)
    written = Plan.from_dict(data, str(path)).to_dict()
    assert {**written, "version": data["version"]} == data


def test_benchmark_plans_are_there_to_check():
    assert BENCHMARK_PLANS, "tests/data/plans, benchmarks/results: the recorded plans this file checks"


def test_a_1_0_plan_loads_with_what_it_lacks_left_empty():
    plan = load_plan(OLD_PLAN)
    assert plan.basis is None and plan.scenarios == [] and plan.comparison_fit == []
    assert plan.memory.gpu_memory_utilization is None and plan.memory.tp_size == 1
    assert plan.inputs.loads == [1.0] and plan.inputs.replicas == 1
    assert plan.decode.histogram.attention_ms is None
    assert plan.to_dict()["version"] == PLAN_VERSION


@pytest.mark.parametrize(
    "edit, field, problem",
    [
        (lambda d: d["scenarios"][0].update(load="x"), "scenarios[0].load", "must be a number"),
        (lambda d: d["basis"].pop("statement"), "basis.statement", "is missing"),
        (lambda d: d["flags"].pop("sglang"), "flags.sglang", "is missing"),
        (lambda d: d.pop("created"), "created", "is missing"),
        (lambda d: d["simulation"]["loads"][0].update(overloaded=1), "simulation.loads[0].overloaded",
         "must be true or false"),
    ],
)
def test_a_damaged_plan_names_the_field(tmp_path, edit, field, problem):
    data = _raw(BENCHMARK_PLANS[0])
    edit(data)
    (tmp_path / "plan.json").write_text(json.dumps(data))
    with pytest.raises(InputError) as exc:
        load_plan(tmp_path)
    assert f"plan.json: field '{field}' {problem}" in exc.value.message


def test_a_damaged_plan_is_one_line_and_exit_2_from_the_cli(tmp_path):
    data = _raw(OLD_PLAN)
    data["memory"]["kv_tokens"] = "many"
    (tmp_path / "plan.json").write_text(json.dumps(data))
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "field 'memory.kv_tokens' must be an integer" in lines[0]
