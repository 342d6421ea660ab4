"""What `cgtool verify` decides before the GPU: here, which runner records prefill graphs."""

from pathlib import Path

from verify_fixture import PLAN as OLD_PLAN
from verify_fixture import synthetic_result

from cgtool.verify.result import VerifyResult
from cgtool.verify.run import _settings, prepare, session_options

PLAN_0523 = Path(__file__).parent / "data" / "plans" / "plan-1.3-example.json"


def test_verify_records_the_prefill_backend_of_the_plans_release():
    inputs = prepare(PLAN_0523, num_steps=50)
    opts = session_options(inputs)
    assert inputs.prefill_backend == opts.prefill_backend == "breakable"  # SGLang 0.5.23
    assert _settings(inputs, opts, 1000).prefill_backend == "breakable"
    assert prepare(OLD_PLAN, num_steps=50).prefill_backend == "piecewise"  # a plan for SGLang 0.4


def test_prefill_backend_flag_overrides_the_release():
    inputs = prepare(PLAN_0523, num_steps=50, prefill_backend="piecewise")
    assert session_options(inputs).prefill_backend == "piecewise"


def test_a_verify_json_without_the_field_ran_torch_compile_pieces():
    data = synthetic_result().to_dict()
    assert data["settings"]["prefill_backend"] == "piecewise"
    del data["settings"]["prefill_backend"]
    assert VerifyResult.from_dict(data).settings.prefill_backend == "piecewise"
