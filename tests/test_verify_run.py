"""What `cgtool verify` decides before the GPU (which runner records prefill graphs), and how it
summarises what the GPU measured."""

from dataclasses import replace
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


def test_the_summary_notes_a_first_set_that_captured_slowly_and_a_set_out_of_memory():
    # As deepseek-v2-lite's held-out verify on an H200 (2026-11-28): the plan's set, captured
    # first, compiled cgtool's kernels (76.8 s for 73 graphs), the default's did not (18.0 s for 94).
    from cgtool.verify.run import summarise_sets
    from cgtool.verify.summary import SetMeasurement

    inputs = prepare(OLD_PLAN, num_steps=50, repeats=2)
    result = synthetic_result()
    times = [[5.0] * len(inputs.steps)] * 2
    plan = SetMeasurement("plan", list(range(1, 34)), list(range(1, 41)), [], 76.8, 1.0, 1 << 30, times)
    default = SetMeasurement("default", list(range(1, 37)), list(range(1, 59)), ["decode 256"], 18.0, 0.3,
                             1 << 30, times)
    result.warnings = []
    summarise_sets(result, inputs, [plan, default])
    assert [s.name for s in result.sets] == ["plan", "default"] and result.ratio is not None
    assert result.warnings[0].startswith("default: out of memory capturing decode 256")
    assert "captured first, took 1.05 s a graph against 0.19" in result.warnings[1]
    result.warnings = []
    summarise_sets(result, inputs, [replace(plan, capture_s=20.0), default])
    assert len(result.warnings) == 1  # 0.27 s a graph against 0.19: no note


def test_the_summary_warns_where_mla_decode_redid_chunks_and_keeps_the_counts():
    from cgtool.verify.result import VerifyResult
    from cgtool.verify.run import summarise_sets
    from cgtool.verify.summary import SetMeasurement

    inputs = prepare(OLD_PLAN, num_steps=50, repeats=2)
    times = [[5.0] * len(inputs.steps)] * 2
    plan = SetMeasurement("plan", [1, 8, 64], [64, 512], [], 3.0, 1.0, 1 << 30, times, mla_chunks_redone=1234)
    default = SetMeasurement("default", [1, 8, 64], [64, 512], [], 3.0, 1.0, 1 << 30, times, mla_chunks_redone=0)
    result = synthetic_result()
    result.warnings = []
    summarise_sets(result, inputs, [plan, default])
    assert [s.mla_chunks_redone for s in result.sets] == [1234, 0]
    (warning,) = [w for w in result.warnings if "MLA" in w]
    assert "(plan 1,234)" in warning and "CGTOOL_MLA_FIXED_MAX=0" in warning
    back = VerifyResult.from_dict(result.to_dict())
    assert [s.mla_chunks_redone for s in back.sets] == [1234, 0]
    result.warnings = []
    summarise_sets(result, inputs, [replace(plan, mla_chunks_redone=None), default])  # not counted, or none
    assert not [w for w in result.warnings if "MLA" in w]
