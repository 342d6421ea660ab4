"""A VerifyResult assembled on the CPU from synthetic timings, to test the schema, the
arithmetic and the rendering. Its step times are made up: no test reads them as measured."""

from __future__ import annotations

from pathlib import Path

from cgtool.documents.results import Environment, ModelInfo
from cgtool.specs.config import load_model_config
from cgtool.verify.result import Rehearsal, VerifyResult, VerifySettings
from cgtool.verify.run import prepare
from cgtool.verify.summary import SetMeasurement, ratio_interval, summarise_set

PLAN = Path(__file__).parent / "data" / "reports" / "plan-llama-3.1-8b" / "plan.json"


def synthetic_result(plan_factor: float = 0.8, repeats: int = 3, steps: int = 200) -> VerifyResult:
    inputs = prepare(PLAN, num_steps=steps, repeats=repeats)
    cfg = load_model_config("llama-3.1-8b")
    sets = []
    for name, factor in (("plan", plan_factor), ("default", 1.0)):
        plan = inputs.plan
        d, p = plan.decode, plan.piecewise
        bs = d.capture_bs if name == "plan" else d.default_capture_bs
        tokens = p.capture_num_tokens if name == "plan" else p.default_capture_num_tokens
        times = [[factor * (5.0 + 0.01 * s.size) * (1 + 0.01 * r) for s in inputs.steps]
                 for r in range(repeats)]
        measured = SetMeasurement(name, list(bs), list(tokens), [], 3.0, 1.0, 1 << 30, times)
        sets.append(summarise_set(measured, inputs.steps, inputs.cost, inputs.plan))
    return VerifyResult(
        environment=Environment("NVIDIA H100 80GB HBM3", 85 << 30, "570", "12.8", "2.13", "0.1.0", "host"),
        model=ModelInfo(cfg.name, cfg.architecture, cfg.config_hash(), "bfloat16", cfg.weight_bytes(2), cfg.num_layers),
        settings=VerifySettings(str(PLAN), None, "histogram", 0.88, "plan", len(inputs.steps), repeats,
                                0, 400_000, 8192, 256, inputs.population.total),
        rehearsal=Rehearsal("ok", 8192, 256, 1024, 70 << 30, 10 << 30, 80 << 30),
        sets=sets,
        ratio=ratio_interval(sets[0].repeat_step_ms, sets[1].repeat_step_ms),
    )
