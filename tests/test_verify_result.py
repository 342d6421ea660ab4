import json

import pytest
from verify_fixture import synthetic_result

from cgtool.documents.provenance import collect_provenance
from cgtool.errors import InputError
from cgtool.verify.result import VerifyResult, load_verify, write_verify
from cgtool.verify.summary import ratio_interval, verify_exit_code


def test_verify_json_round_trips(tmp_path):
    result = synthetic_result()
    write_verify(result, tmp_path / "verify.json")
    again = load_verify(tmp_path / "verify.json")
    assert again == result
    assert json.loads((tmp_path / "verify.json").read_text())["schema"] == "cgtool.verify"


def test_provenance_round_trips_and_older_files_without_it_load(tmp_path):
    result = synthetic_result()
    result.provenance = collect_provenance(["cgtool", "verify", "--plan", "p/plan.json"])
    write_verify(result, tmp_path / "verify.json")
    assert load_verify(tmp_path / "verify.json").provenance == result.provenance
    body = json.loads((tmp_path / "verify.json").read_text())
    del body["provenance"]
    (tmp_path / "verify.json").write_text(json.dumps(body))
    assert load_verify(tmp_path / "verify.json").provenance is None


def test_a_folder_holding_verify_json_loads(tmp_path):
    write_verify(synthetic_result(), tmp_path / "verify.json")
    assert load_verify(tmp_path).settings.steps == 200


def test_a_missing_field_is_named(tmp_path):
    data = synthetic_result().to_dict()
    del data["rehearsal"]["headroom_bytes"]
    (tmp_path / "verify.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match="rehearsal.headroom_bytes"):
        load_verify(tmp_path / "verify.json")


@pytest.mark.parametrize(("where", "value", "message"), [
    (("sizes", 0, "graph_size"), 2**40, r"sizes\[0\].graph_size' must be from 0 to 65,536 for a decode graph"),
    (("sizes", 0, "size"), 2**40, r"sizes\[0\].size' must be from 1 to 1,048,576"),
    (("capture_bs",), [1, 2**40], r"capture_bs\[1\]' must be from 1 to 65,536"),
])
def test_a_size_past_any_server_is_refused_in_one_line(tmp_path, where, value, message):
    # `plan --profile` of such a verify.json asked numpy for terabytes (a table as long as the
    # largest size) and died with MemoryError.
    data = synthetic_result().to_dict()
    target = data["sets"][1]
    for step in where[:-1]:
        target = target[step]
    target[where[-1]] = value
    (tmp_path / "verify.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match=message):
        load_verify(tmp_path / "verify.json")


def test_a_plan_is_not_a_verify_document(tmp_path):
    from verify_fixture import PLAN

    with pytest.raises(InputError, match="schema"):
        VerifyResult.from_dict(json.loads(PLAN.read_text()), str(PLAN))


def test_weighted_means_follow_the_step_weights():
    result = synthetic_result(plan_factor=1.0)
    plan, default = result.sets
    assert plan.mean_step_ms == pytest.approx(default.mean_step_ms)
    total = sum(k.weight for k in plan.kinds)
    assert total == pytest.approx(result.settings.simulated_steps)


def test_a_plan_clearly_faster_exits_0_and_clearly_slower_exits_1():
    assert synthetic_result(plan_factor=0.8).ratio.verdict == "faster"
    assert verify_exit_code(synthetic_result(plan_factor=0.8)) == 0
    slower = synthetic_result(plan_factor=1.2)
    assert slower.ratio.verdict == "slower" and verify_exit_code(slower) == 1


def test_a_ratio_inside_the_noise_is_no_verdict():
    ratio = ratio_interval([10.0, 10.4, 9.7], [10.1, 10.0, 10.1])
    assert ratio.ci_low < 1.0 < ratio.ci_high and ratio.verdict == "same"


def test_an_out_of_memory_rehearsal_exits_1():
    result = synthetic_result()
    result.status, result.ratio = "oom", None
    assert verify_exit_code(result) == 1


def test_predictions_are_finite_and_every_sampled_size_has_a_row():
    result = synthetic_result()
    for graph_set in result.sets:
        assert sum(r.steps for r in graph_set.sizes) == result.settings.steps
        assert all(r.predicted_ms > 0 for r in graph_set.sizes)
