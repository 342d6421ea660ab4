import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from cgtool.commands.capture import choose_sizes, parse_sizes
from cgtool.commands.main import app
from cgtool.documents.invariants import memory_violations
from cgtool.documents.results import load_report
from cgtool.errors import CgtoolError

runner = CliRunner()
FIXTURES = Path(__file__).parent / "data" / "reports"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_capture_without_gpu_exits_2_and_points_to_plan():
    result = runner.invoke(app, ["capture", "--model", "tiny"])
    assert result.exit_code == 2
    assert "needs a CUDA GPU" in result.output and "cgtool plan" in result.output
    assert "Traceback" not in result.output


def test_parse_sizes_accepts_commas_and_spaces():
    assert parse_sizes("8, 1,4 2", "--bs") == [1, 2, 4, 8]


@pytest.mark.parametrize("text", ["1,x", "0,2", ""])
def test_parse_sizes_rejects_bad_lists_naming_the_flag(text):
    with pytest.raises(CgtoolError, match="--bs"):
        parse_sizes(text, "--bs")


def test_bad_mem_fraction_is_exit_2():
    result = runner.invoke(app, ["capture", "--mem-fraction-static", "1.5"])
    assert result.exit_code == 2 and "--mem-fraction-static" in result.output


@pytest.mark.gpu
def test_capture_cli_end_to_end_writes_a_verified_report(tmp_path):
    # The installed script in a process of its own: in this one its KV pool (0.85 of the GPU)
    # stayed reserved after the command returned, and the next GPU test found 20 GiB free.
    from cli_run import piped

    out = tmp_path / "run"
    piped("capture", "--model", "qwen2.5-0.5b", "--bs", "1,2,4", "--tokens", "64,128",
          "--context-len", "256", "--out", str(out), timeout_s=400)
    report = json.loads((out / "report.json").read_text())
    kinds = {(row["kind"], row["size"]) for row in report["sizes"]}
    assert kinds == {("decode", 1), ("decode", 2), ("decode", 4), ("piecewise", 64), ("piecewise", 128)}
    assert all(row["status"] == "ok" for row in report["sizes"])
    retained = sum(row["retained_bytes"] for row in report["sizes"])
    assert retained == report["totals"]["graph_pool_bytes"]
    assert memory_violations(load_report(out)) == []  # the invariants hold on a real capture
    assert set(report["totals"]["phase_s"]) >= {"load", "compile", "capture", "measure", "render"}


@pytest.mark.parametrize(("fixture", "code"), [("h100-llama-3.1-8b", 0), ("h100-llama-3.1-8b-oom", 1)])
def test_capture_saves_its_sizes_and_exits_1_when_incomplete_0_when_complete(tmp_path, monkeypatch, fixture, code):
    # The session is replaced by the report it would return (the OOM fixture: decode bs 256 ran
    # out of memory, the smaller sizes fitted); saving and the exit code run as on a GPU.
    from cgtool.capture import session

    returned = load_report(FIXTURES / fixture)
    monkeypatch.setattr(session, "require_cuda", lambda: None)
    monkeypatch.setattr(session, "run_capture", lambda opts, on_progress, state: returned)
    out = tmp_path / "run"
    result = runner.invoke(app, ["capture", "--model", "llama-3.1-8b", "--out", str(out)])
    assert result.exit_code == code, result.output
    saved = load_report(out)
    assert saved.status == returned.status and saved.sizes == returned.sizes
    if code:
        assert "incomplete: out of memory capturing decode bs 256" in result.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the order against the GPU check")
@pytest.mark.parametrize(("args", "expected"), [
    (["--plan", "nonexistent.json"], "nonexistent.json"),
    (["--model", "nope"], "unknown model preset 'nope'"),
    (["--bs", "abc"], "--bs 'abc' is not a list of integers"),
    (["--tokens", "0"], "--tokens '0' must list positive integers"),
    (["--tp", "3", "--model", "llama-3.1-8b"], "--tp 3 does not divide"),
    (["--hidden-states", "half"], "--hidden-states 'half' is not a hidden-state mode"),
    (["--hidden-states", "full,null"], "only recaptures upward"),
    (["--hidden-states", "full", "--kind", "piecewise"], "applies to decode graphs"),
])
def test_arguments_are_checked_before_the_gpu(args, expected):
    result = runner.invoke(app, ["capture", *args])
    assert result.exit_code == 2
    assert expected in result.stderr and "CUDA GPU" not in result.stderr


@pytest.mark.parametrize(("args", "flag"), [
    (["--max-bs", "100000000000"], "--max-bs"),
    (["--max-tokens", "100000000000"], "--max-tokens"),
    (["--bs", "1,100000000000"], "--bs"),
    (["--tokens", "64,100000000000"], "--tokens"),
])
def test_huge_sizes_are_refused_in_one_line_before_any_list_is_built(args, flag):
    # --max-bs 1e11 once built SGLang's list of 3e9 sizes: 24 GiB, then killed by the kernel.
    result = runner.invoke(app, ["capture", "--model", "tiny", *args])
    assert result.exit_code == 2
    assert f"error: {flag} 100000000000 is past the" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "CUDA GPU" not in result.stderr


def test_the_size_limits_leave_room_past_every_engine_default():
    # vLLM's B200 default reaches 1,024 batches, SGLang's largest chunk 16,384 tokens.
    capture_bs, tokens = choose_sizes(None, 1 << 16, None, 1 << 20, None)
    assert capture_bs[-1] == 1 << 16 and tokens[-1] == 1 << 20
    assert len(capture_bs) < 2100 and len(tokens) < 2100


@pytest.mark.parametrize(("flag", "expected"), [([], True), (["--no-compile-cache"], False)])
def test_no_compile_cache_flag_reaches_the_session(tmp_path, monkeypatch, flag, expected):
    from cgtool.capture import session

    seen = []

    def run(opts, on_progress, state):
        seen.append(opts.compile_cache)
        return load_report(FIXTURES / "h100-llama-3.1-8b")

    monkeypatch.setattr(session, "require_cuda", lambda: None)
    monkeypatch.setattr(session, "run_capture", run)
    result = runner.invoke(app, ["capture", "--kind", "piecewise", *flag, "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert seen == [expected]


def test_an_unforeseen_error_keeps_the_measured_sizes_and_the_traceback(tmp_path, monkeypatch):
    # A Triton kernel too large for the GPU's shared memory stopped a capture with a traceback
    # and no report (H100, 2026-11-23); now it is a failed run with what was measured.
    from cgtool.capture import session

    measured = load_report(FIXTURES / "h100-llama-3.1-8b")

    def crash(opts, on_progress, state):
        state.sizes = measured.sizes[:3]
        state.stopped_in = "compile piecewise"
        raise RuntimeError("out of resource: shared memory, Required: 786432\nsecond line")

    def partial(opts, state, reason):
        measured.sizes, measured.status = state.sizes, "incomplete"
        measured.incomplete_reason = reason
        return measured

    monkeypatch.setattr(session, "require_cuda", lambda: None)
    monkeypatch.setattr(session, "run_capture", crash)
    monkeypatch.setattr(session, "partial_report", partial)
    out = tmp_path / "run"
    result = runner.invoke(app, ["capture", "--model", "llama-3.1-8b", "--out", str(out)])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert ("capture stopped during compile piecewise by RuntimeError: out of resource: shared "
            "memory, Required: 786432") in " ".join(result.output.split())
    saved = load_report(out)
    assert saved.incomplete_reason.startswith("stopped by RuntimeError: out of resource")
    assert [s.size for s in saved.sizes] == [s.size for s in measured.sizes[:3]]
    assert "second line" in (out / "error.log").read_text()  # the whole traceback, for a bug report


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the order against the GPU check")
@pytest.mark.parametrize(("args", "expected"), [
    (["--image-sizes", "448x448x3"], "--image-sizes '448x448x3' is not HEIGHTxWIDTH"),
    (["--image-sizes", "448x450"], "--image-sizes 448x450 is not a size the qwen2.5-vl-7b processor"),
    (["--image-sizes", "448x896,896x448"], "both give 2048 patches"),
    (["--model", "qwen2.5-7b"], "--model qwen2.5-7b is not a vision preset"),
    (["--model", "llama-3.1-8b"], "--model llama-3.1-8b is not a vision preset"),  # named, not defaulted
    (["--tp", "2"], "--kind vit runs on one GPU"),
    (["--hidden-states", "full"], "--kind vit captures none"),
    (["--profile-sizes", "vit:999"], "'vit:999' is not a captured size"),
])
def test_vit_arguments_are_checked_before_the_gpu(args, expected):
    result = runner.invoke(app, ["capture", "--kind", "vit", *args])
    assert result.exit_code == 2
    assert expected in result.stderr and "CUDA GPU" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_image_sizes_without_kind_vit_is_exit_2():
    result = runner.invoke(app, ["capture", "--image-sizes", "448x448"])
    assert result.exit_code == 2 and "--image-sizes applies to --kind vit" in result.stderr


def test_kind_vit_resolves_the_vision_preset_and_default_sizes(tmp_path, monkeypatch):
    # The session is replaced by a stand-in that records its options; the options reach it as
    # a GPU run would get them.
    from cgtool.capture import session, vit

    seen = {}

    def fake_run(opts, on_progress, state):
        seen["opts"] = opts
        raise CgtoolError("stop here", "Nothing to do.")

    monkeypatch.setattr(session, "require_cuda", lambda: None)
    monkeypatch.setattr(vit, "run_vit_capture", fake_run)
    result = runner.invoke(app, ["capture", "--kind", "vit", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "stop here" in result.stderr
    opts = seen["opts"]
    assert opts.model == "qwen2.5-vl-7b" and opts.kinds == ("vit",)
    assert len(opts.image_sizes) >= 4 and opts.capture_bs == [] and opts.capture_num_tokens == []
    assert opts.profile_sizes["vit"] == (1024, 9216)  # 448x448 and 1344x1344


def test_kind_vit_takes_the_image_sizes_of_a_plan_with_images(tmp_path, monkeypatch):
    import dataclasses

    from cgtool.capture import session, vit
    from cgtool.documents.plan_document import VitPlan, write_plan
    from cgtool.documents.results import load_plan

    plan = load_plan(FIXTURES / "plan-llama-3.1-8b")
    plan.vit = VitPlan(preset="qwen2.5-vl-7b", env="SGLANG_VIT_ENABLE_CUDA_GRAPH=1", num_images=3,
                       refused_images=0, capture_patches=[1024, 3072],
                       image_sizes=[[448, 448], [896, 672]], coverage=1.0, min_share=0.005)
    write_plan(dataclasses.replace(plan), tmp_path / "plan.json")
    seen = {}

    def fake_run(opts, on_progress, state):
        seen["sizes"] = opts.image_sizes
        raise CgtoolError("stop here", "Nothing to do.")

    monkeypatch.setattr(session, "require_cuda", lambda: None)
    monkeypatch.setattr(vit, "run_vit_capture", fake_run)
    result = runner.invoke(app, ["capture", "--kind", "vit", "--plan", str(tmp_path / "plan.json"),
                                 "--out", str(tmp_path / "o")])
    assert "stop here" in result.stderr, result.output
    assert seen["sizes"] == ((448, 448), (896, 672))
