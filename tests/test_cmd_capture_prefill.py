import json

import pytest
from cli_run import cgtool, piped


@pytest.mark.parametrize(("args", "named"), [
    (["--compiler", "inductor"], "--compiler inductor"),
    (["--tp", "2"], "--tp 2"),
])
def test_breakable_prefill_refuses_what_it_cannot_do_before_the_gpu(args, named):
    result = cgtool("capture", "--model", "tiny", "--prefill-backend", "breakable", *args)
    assert result.exit_code == 2
    assert named in result.output and "--prefill-backend" in result.output
    assert "Traceback" not in result.output and "CUDA GPU" not in result.output


def test_an_unknown_prefill_backend_is_refused_by_the_parser():
    result = cgtool("capture", "--model", "tiny", "--prefill-backend", "tc_piecewise")
    assert result.exit_code == 2 and "tc_piecewise" in result.output


@pytest.mark.gpu
def test_breakable_capture_verifies_each_size_and_compiles_nothing(tmp_path):
    # A process of its own, as test_cmd_capture's: the whole gpu-marked suite found 0 KV tokens
    # of room here after an in-process capture (H200, 2026-11-26).
    out = tmp_path / "run"
    piped("capture", "--model", "qwen2.5-0.5b", "--kind", "piecewise", "--tokens", "64,128",
          "--prefill-backend", "breakable", "--out", str(out), timeout_s=400)
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["prefill_backend"] == "breakable"
    assert {(r["kind"], r["size"], r["status"]) for r in report["sizes"]} == {
        ("piecewise", 64, "ok"), ("piecewise", 128, "ok")}
    assert "compile" not in report["totals"]["phase_s"] and "warmup" in report["totals"]["phase_s"]
