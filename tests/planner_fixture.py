"""The planner tests' common subject: Llama 3.1 8B on an H100, and the hand-written capture
report of it in tests/data/planner (a fixture, not a measurement)."""

from __future__ import annotations

import json
from pathlib import Path

from cgtool.planner.cost import CostModel, roofline_cost
from cgtool.specs.config import load_model_config
from cgtool.specs.gpus import gpu_spec

CFG = load_model_config("llama-3.1-8b")
H100 = gpu_spec("H100-80GB")
REPORT_PATH = Path(__file__).parent / "data" / "planner" / "report-h100-llama8b.json"
REPORT = json.loads(REPORT_PATH.read_text())


def roofline_8b() -> CostModel:
    """The roofline model the planner builds for CFG on H100 at the engine's default limits."""
    return roofline_cost(CFG, H100, max_bs=512, max_tokens=8192)
