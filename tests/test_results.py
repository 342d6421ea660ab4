"""report.json / plan.json: round trip, rejection of bad files, atomic writes, fuzzing."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cgtool.documents.document_io import write_json_atomic
from cgtool.documents.results import (
    CaptureReport,
    load_document,
    load_plan,
    load_report,
    write_report,
)
from cgtool.errors import InputError

FIXTURES = Path(__file__).parent / "data" / "reports"
REPORT = FIXTURES / "h100-llama-3.1-8b" / "report.json"
OOM_REPORT = FIXTURES / "h100-llama-3.1-8b-oom" / "report.json"
PLAN = FIXTURES / "plan-llama-3.1-8b" / "plan.json"


def _raw(path: Path) -> dict:
    return json.loads(path.read_text())


def _write(tmp_path: Path, data: object, name: str = "report.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_fixture_report_loads_with_36_decode_sizes_largest_first():
    report = load_report(REPORT)
    decode = report.sizes_of("decode")
    assert len(decode) == 36
    assert [s.size for s in decode][:3] == [256, 248, 240]
    assert report.kinds() == ["decode", "piecewise"]


def test_report_round_trips_through_to_dict(tmp_path):
    report = load_report(REPORT)
    write_report(report, tmp_path / "report.json")
    again = load_report(tmp_path)
    assert again == report
    assert list(again.to_dict())[:5] == ["schema", "version", "status", "incomplete_reason", "created"]


def test_failed_size_may_have_null_latencies():
    report = load_report(OOM_REPORT)
    failed = [s for s in report.sizes if s.status == "failed"]
    assert [s.size for s in failed] == [256]
    assert failed[0].replay_ms is None and report.status == "incomplete"


def test_ok_size_with_null_latency_is_rejected(tmp_path):
    data = _raw(REPORT)
    data["sizes"][2]["replay_ms"] = None
    with pytest.raises(InputError, match=r"sizes\[2\]\.replay_ms.*null but status is 'ok'"):
        load_report(_write(tmp_path, data))


def test_optional_fields_take_defaults_when_absent(tmp_path):
    data = _raw(REPORT)
    del data["sizes"][0]["rank"], data["sizes"][0]["roofline_ms"]
    report = load_report(_write(tmp_path, data))
    assert report.sizes[0].rank == 0 and report.sizes[0].roofline_ms is None


def test_compile_cache_status_round_trips_and_is_null_in_older_reports(tmp_path):
    data = _raw(REPORT)
    assert "compile_cache" not in data["totals"] and load_report(REPORT).totals.compile_cache is None
    data["totals"]["compile_cache"] = "hit"
    assert load_report(_write(tmp_path, data)).totals.compile_cache == "hit"
    data["totals"]["compile_cache"] = "warm"
    with pytest.raises(InputError, match=r"totals\.compile_cache"):
        load_report(_write(tmp_path, data))


def test_dependent_launch_round_trips_and_is_null_in_older_reports(tmp_path):
    data = _raw(REPORT)
    assert "dependent_launch" not in data["environment"]
    assert load_report(REPORT).environment.dependent_launch is None
    data["environment"]["dependent_launch"] = False
    report = load_report(_write(tmp_path, data))
    assert report.environment.dependent_launch is False
    (tmp_path / "again").mkdir()
    write_report(report, tmp_path / "again" / "report.json")
    assert load_report(tmp_path / "again").environment.dependent_launch is False
    data["environment"]["dependent_launch"] = "yes"
    with pytest.raises(InputError, match=r"environment\.dependent_launch"):
        load_report(_write(tmp_path, data))


def test_unknown_fields_of_a_newer_minor_version_are_ignored(tmp_path):
    data = _raw(REPORT) | {"version": "1.7", "new_section": {"x": 1}}
    data["sizes"][0]["new_metric"] = 3.5
    assert len(load_report(_write(tmp_path, data)).sizes) == 42


def test_unknown_major_version_is_rejected(tmp_path):
    data = _raw(REPORT) | {"version": "2.0"}
    with pytest.raises(InputError, match="unknown major version 2"):
        load_report(_write(tmp_path, data))


@pytest.mark.parametrize("version", [None, 1, "", "v1", "one.two"])
def test_malformed_version_is_rejected(tmp_path, version):
    with pytest.raises(InputError, match="field 'version'"):
        load_report(_write(tmp_path, _raw(REPORT) | {"version": version}))


def test_wrong_schema_is_rejected(tmp_path):
    with pytest.raises(InputError, match="field 'schema' is 'something.else'"):
        load_report(_write(tmp_path, _raw(REPORT) | {"schema": "something.else"}))


def test_truncated_file_names_file_and_position(tmp_path):
    path = tmp_path / "report.json"
    path.write_text(REPORT.read_text()[:5000])
    with pytest.raises(InputError, match=r"report\.json: not valid JSON at line \d+ column \d+"):
        load_report(path)


def test_empty_and_binary_files_are_rejected(tmp_path):
    (tmp_path / "empty.json").write_text("")
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(InputError, match="file is empty"):
        load_report(tmp_path / "empty.json")
    with pytest.raises(InputError, match="not UTF-8"):
        load_report(tmp_path / "bin.json")


def test_nan_is_not_accepted_as_a_number(tmp_path):
    path = tmp_path / "report.json"
    path.write_text(REPORT.read_text().replace('"speedup": 1.0348', '"speedup": NaN', 1))
    with pytest.raises(InputError, match="NaN"):
        load_report(path)


def test_an_integer_past_float_range_is_named_not_a_traceback(tmp_path):
    path = tmp_path / "report.json"
    path.write_text(REPORT.read_text().replace('"speedup": 1.0348', '"speedup": 1' + "0" * 400, 1))
    with pytest.raises(InputError, match="must be a finite number, got an integer of 401 digits"):
        load_report(path)


def test_missing_field_is_named_with_its_path(tmp_path):
    data = _raw(REPORT)
    del data["sizes"][7]["retained_bytes"]
    with pytest.raises(InputError, match=r"field 'sizes\[7\]\.retained_bytes' is missing"):
        load_report(_write(tmp_path, data))


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("totals", "kv_tokens"), "lots", "must be an integer, got a string"),
        (("totals", "kv_tokens"), 1.5, "must be an integer, got a number"),
        (("sizes", 0, "kind"), "prefill", "must be one of 'decode', 'piecewise'"),
        (("sizes", 0, "size"), 0, "must be from 1 to 65,536 for a decode graph, got 0"),
        (("settings", "enable_cudagraph_gc"), 1, "must be true or false"),
        (("environment", "gpu_memory_bytes"), True, "must be an integer, got true/false"),
        (("settings", "capture_bs"), [1, "2"], r"capture_bs\[1\]' must be an integer"),
        (("created",), "yesterday", "not an ISO-8601 time"),
    ],
)
def test_wrong_typed_field_is_named(tmp_path, path, value, message):
    data = _raw(REPORT)
    target = data
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    with pytest.raises(InputError, match=message):
        load_report(_write(tmp_path, data))


def test_duplicate_size_is_rejected(tmp_path):
    data = _raw(REPORT)
    data["sizes"].append(copy.deepcopy(data["sizes"][3]))
    with pytest.raises(InputError, match="repeats decode size"):
        load_report(_write(tmp_path, data))


def test_plan_loads_as_a_typed_plan():
    plan = load_plan(PLAN.parent)
    assert plan.simulation.num_requests == 20000
    assert plan.decode.max_bs == 160


def test_plan_missing_field_is_named(tmp_path):
    data = _raw(PLAN)
    del data["memory"]["graph_bytes"]
    with pytest.raises(InputError, match=r"plan\.json: field 'memory\.graph_bytes' is missing"):
        load_plan(_write(tmp_path, data, "plan.json"))


def test_report_and_plan_loaders_refuse_each_other():
    with pytest.raises(InputError, match="is a plan"):
        load_report(PLAN)
    with pytest.raises(InputError, match="is a capture report"):
        load_plan(REPORT)


def test_folder_without_a_document_is_rejected(tmp_path):
    with pytest.raises(InputError, match="neither report.json nor plan.json"):
        load_document(tmp_path)
    with pytest.raises(InputError, match="no such file"):
        load_document(tmp_path / "missing.json")


def test_atomic_write_leaves_old_file_when_serialising_fails(tmp_path):
    path = tmp_path / "report.json"
    write_json_atomic(path, {"a": 1})
    with pytest.raises(ValueError):
        write_json_atomic(path, {"a": float("nan")})  # allow_nan=False fails before the rename
    assert json.loads(path.read_text()) == {"a": 1}
    assert os.listdir(tmp_path) == ["report.json"]  # no temporary file left behind


def test_atomic_write_replaces_through_rename(tmp_path, monkeypatch):
    path = tmp_path / "report.json"
    write_json_atomic(path, {"a": 1})
    calls = []
    real_replace = os.replace

    def spy(src, dst):
        calls.append((Path(src).parent, Path(dst)))
        assert json.loads(Path(dst).read_text()) == {"a": 1}  # old content until the rename
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    write_json_atomic(path, {"a": 2})
    assert calls == [(tmp_path, path)]
    assert json.loads(path.read_text()) == {"a": 2}


def test_interrupted_write_keeps_old_file(tmp_path, monkeypatch):
    path = tmp_path / "report.json"
    write_json_atomic(path, {"a": 1})

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_json_atomic(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 1}
    assert os.listdir(tmp_path) == ["report.json"]


# --- Fuzzing (issue 7, item 1): every bad file is one InputError naming file and field. ---
# Generated cases: 300 random byte strings, 200 truncations, 400 field mutations,
# 150 field deletions, 150 plan mutations: 1,200 cases per run.

_BASE_REPORT = _raw(REPORT)
_BASE_PLAN = _raw(PLAN)


def _fuzz(num_cases: int) -> settings:
    return settings(max_examples=num_cases, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])



_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30)
    | st.integers(min_value=10**308, max_value=10**400)  # JSON integers past what float() takes
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


def _leaf_paths(value: object, prefix: tuple = ()) -> list[tuple]:
    if isinstance(value, dict):
        return [prefix] + [p for k, v in value.items() for p in _leaf_paths(v, prefix + (k,))]
    if isinstance(value, list):
        return [prefix] + [p for i, v in enumerate(value[:3]) for p in _leaf_paths(v, prefix + (i,))]
    return [prefix]


_REPORT_PATHS = [p for p in _leaf_paths(_BASE_REPORT) if p]
_PLAN_PATHS = [p for p in _leaf_paths(_BASE_PLAN) if p]


def _set(data: dict, path: tuple, value: object) -> dict:
    data = copy.deepcopy(data)
    target = data
    for step in path[:-1]:
        target = target[step]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return data


_DELETE = object()


def _assert_loads_or_names_the_problem(path: Path) -> None:
    try:
        load_document(path)
    except InputError as exc:
        text = str(exc)
        assert text.startswith(f"{path}: "), text
        assert "\n" not in exc.message
    # any other exception type fails the test: that would be a traceback for the user


@_fuzz(300)
@given(st.binary(max_size=400))
def test_fuzz_random_bytes_never_traceback(tmp_path, blob):
    path = tmp_path / "report.json"
    path.write_bytes(blob)
    _assert_loads_or_names_the_problem(path)


@_fuzz(200)
@given(st.integers(min_value=0, max_value=len(REPORT.read_bytes().rstrip()) - 1))
def test_fuzz_truncated_report_is_rejected(tmp_path, cut):
    path = tmp_path / "report.json"
    path.write_bytes(REPORT.read_bytes()[:cut])
    with pytest.raises(InputError, match=str(path)):
        load_report(path)


@_fuzz(400)
@given(st.sampled_from(_REPORT_PATHS), _json_values)
def test_fuzz_mutated_report_field_loads_or_is_named(tmp_path, field_path, value):
    path = _write(tmp_path, _set(_BASE_REPORT, field_path, value))
    _assert_loads_or_names_the_problem(path)


_REQUIRED_REPORT_PATHS = [p for p in _REPORT_PATHS if p[-1] not in (
    "rank", "roofline_ms", "status", "incomplete_reason", "created", "artifacts", "tp_size",
    "copy_bandwidth_bytes_s", "memory_snapshot", "chrome_trace", "kernel_tables", "_fixture",
    "provenance",
) and not (len(p) > 1 and p[-2] == "kernel_tables") and not isinstance(p[-1], int)]


@_fuzz(150)
@given(st.sampled_from(_REQUIRED_REPORT_PATHS))
def test_fuzz_deleted_required_field_is_named(tmp_path, field_path):
    path = _write(tmp_path, _set(_BASE_REPORT, field_path, _DELETE))
    with pytest.raises(InputError) as caught:
        load_report(path)
    assert str(field_path[-1]) in str(caught.value)


@_fuzz(150)
@given(st.sampled_from(_PLAN_PATHS), _json_values)
def test_fuzz_mutated_plan_field_loads_or_is_named(tmp_path, field_path, value):
    path = _write(tmp_path, _set(_BASE_PLAN, field_path, value), "plan.json")
    _assert_loads_or_names_the_problem(path)


def test_report_dataclass_builds_without_created_and_stamps_now():
    base = load_report(REPORT)
    fresh = CaptureReport(base.environment, base.model, base.settings, base.sizes, base.totals)
    assert fresh.created[:2] == "20" and fresh.status == "complete"


def test_provenance_round_trips_and_follows_created(tmp_path):
    report = load_report(REPORT)
    assert report.provenance is not None and report.provenance.commit == "unknown"
    write_report(report, tmp_path / "report.json")
    assert load_report(tmp_path).provenance == report.provenance
    keys = list(_raw(tmp_path / "report.json"))
    assert keys[keys.index("created") + 1] == "provenance"


def test_report_written_before_provenance_loads_and_stays_without_it(tmp_path):
    data = _raw(REPORT)
    del data["provenance"]
    report = load_report(_write(tmp_path, data))
    assert report.provenance is None
    assert "provenance" not in report.to_dict()


def test_provenance_with_a_wrong_type_is_named(tmp_path):
    data = _raw(REPORT)
    data["provenance"]["cpu_count"] = "two"
    with pytest.raises(InputError, match=r"field 'provenance\.cpu_count' must be an integer"):
        load_report(_write(tmp_path, data))


def test_plan_provenance_is_optional_but_checked_when_present(tmp_path):
    data = _raw(PLAN)
    data["provenance"]["command"] = "cgtool plan"
    with pytest.raises(InputError, match=r"field 'provenance\.command' must be a list"):
        load_plan(_write(tmp_path, data, "plan.json"))
    del data["provenance"]
    assert load_plan(_write(tmp_path, data, "plan.json")).provenance is None


def test_a_recaptured_mode_adds_rows_listed_after_the_first_modes():
    data = _raw(REPORT)
    decode = [row for row in data["sizes"] if row["kind"] == "decode"][:2]
    for row in decode:
        data["sizes"].append({**copy.deepcopy(row), "hidden_mode": "full"})
    data["settings"]["hidden_states"] = ["null", "full"]
    report = CaptureReport.from_dict(data)
    modes = [(s.hidden_mode, s.size) for s in report.sizes_of("decode")]
    assert modes[:36] == [("null", s) for _, s in modes[:36]]
    assert modes[36:] == [("full", decode[0]["size"]), ("full", decode[1]["size"])]
    assert report.settings.hidden_states == ["null", "full"]


def test_a_report_without_modes_reads_as_null(tmp_path):
    report = load_report(REPORT)
    assert report.settings.hidden_states == ["null"]
    assert {s.hidden_mode for s in report.sizes} == {"null"}


def test_an_unknown_hidden_mode_is_named(tmp_path):
    data = _raw(REPORT)
    data["sizes"][1]["hidden_mode"] = "most"
    with pytest.raises(InputError, match=r"sizes\[1\]\.hidden_mode.*'most'"):
        load_report(_write(tmp_path, data))


def test_experts_active_round_trips_and_is_absent_for_dense_reports(tmp_path):
    assert {s.experts_active for s in load_report(REPORT).sizes} == {None}
    data = _raw(REPORT)
    data["sizes"][0]["experts_active"] = 5.75
    data["settings"]["moe_backend"] = "torch"
    report = load_report(_write(tmp_path, data))
    assert report.sizes[0].experts_active == 5.75
    assert report.settings.moe_backend == "torch"
    assert CaptureReport.from_dict(report.to_dict()).sizes[0].experts_active == 5.75


def test_mla_chunks_redone_round_trips_goes_to_the_csv_and_is_never_negative(tmp_path):
    from cgtool.reports.csv import sizes_frame

    assert {s.mla_chunks_redone for s in load_report(REPORT).sizes} == {None}
    data = _raw(REPORT)
    data["sizes"][0]["mla_chunks_redone"] = 7
    report = load_report(_write(tmp_path, data))
    assert report.sizes[0].mla_chunks_redone == 7
    assert CaptureReport.from_dict(report.to_dict()).sizes[0].mla_chunks_redone == 7
    column = sizes_frame(report)["mla_chunks_redone"]
    assert column.iloc[0] == 7 and column.iloc[1:].isna().all()
    data["sizes"][0]["mla_chunks_redone"] = -1
    with pytest.raises(InputError, match=r"sizes\[0\]\.mla_chunks_redone.*below 0"):
        load_report(_write(tmp_path, data))


@pytest.mark.parametrize("path", [("totals", "kv_tokens"), ("sizes", 0, "retained_bytes"), ("sizes", 0, "size")])
def test_an_integer_field_past_2_to_the_53_is_named_not_a_traceback(tmp_path, path):
    # Read on, such a value made numpy or float() raise OverflowError in `check`, `plan --profile`
    # and `report`.
    for value, shown in ((10**400, "an integer of 401 digits"), (2**53 + 1, "9,007,199,254,740,993")):
        with pytest.raises(InputError, match=f"must be at most 9,007,199,254,740,992 in size, got {shown}"):
            load_report(_write(tmp_path, _set(_raw(REPORT), path, value)))


@pytest.mark.parametrize(("path", "value", "message"), [
    (("sizes", 0, "size"), 65_537, "must be from 1 to 65,536 for a decode graph, got 65,537"),
    (("settings", "capture_bs"), [1, 2**40], r"capture_bs\[1\]' must be from 1 to 65,536 for a decode graph"),
    (("settings", "capture_num_tokens"), [2**21], r"capture_num_tokens\[0\]' must be from 1 to 1,048,576"),
])
def test_a_graph_size_past_what_any_server_captures_is_refused(tmp_path, path, value, message):
    # A planner table is indexed by size: a decode size of 2**53 in a report asked numpy for 64 PiB.
    with pytest.raises(InputError, match=message):
        load_report(_write(tmp_path, _set(_raw(REPORT), path, value)))


@pytest.mark.parametrize(("part", "name", "value", "message"), [
    ("decode", "capture_bs", [1, 2**53], r"decode.capture_bs\[1\]' must be from 1 to 65,536"),
    ("decode", "max_bs", 2**53, "decode.max_bs' must be from 0 to 65,536"),
    ("piecewise", "capture_num_tokens", [256, 2**53], r"piecewise.capture_num_tokens\[1\]' must be from 1 to 1,048,576"),
])
def test_a_plan_with_a_graph_size_past_the_limit_is_refused(tmp_path, part, name, value, message):
    # `plan --compare-plan` of such a plan.json raised numpy's MemoryError before.
    data = _raw(PLAN)
    data[part][name] = value
    with pytest.raises(InputError, match=message):
        load_plan(_write(tmp_path, data, "plan.json"))
