import json

from typer.testing import CliRunner

from cgtool.commands.main import app

runner = CliRunner()


def cgtool(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_schedule_names_the_release_it_reproduces():
    result = cgtool("schedule")
    assert result.exit_code == 0, result.output
    assert "SGLang 0.5.23 default capture schedule" in result.output
    assert "1 2 4 8 12 16 24" in result.output


def test_schedule_json_for_a_release_and_limits():
    result = cgtool(
        "schedule",
        "--engine",
        "sglang",
        "--engine-version",
        "0.5.4",
        "--max-bs",
        "32",
        "--max-tokens",
        "1024",
        "--json",
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["decode_bs"] == [1, 2, 4, 8, 12, 16, 24, 32]
    assert data["piecewise_tokens"][-3:] == [768, 896, 1024]  # 0.5.4: 640-4096 by 128
    assert data["version"] == "0.5.4"


def test_gpu_sets_the_engine_limits():
    data = json.loads(cgtool("schedule", "--gpu", "A100-40GB", "--json").stdout)
    assert data["max_bs"] == 32 and data["max_tokens"] == 4096


def test_vllm_and_trtllm_schedules():
    vllm = json.loads(cgtool("schedule", "--engine", "vllm", "--gpu", "H100-80GB", "--json").stdout)
    assert vllm["decode_bs"][-1] == 512 and vllm["version"] == "0.33"
    trt = json.loads(cgtool("schedule", "--engine", "trtllm", "--json").stdout)
    assert trt["decode_bs"][-3:] == [32, 64, 128] and trt["pads"] is False
    assert "pads to the next size" in cgtool("schedule", "--engine", "trtllm").output


def test_bad_engine_or_release_exits_2():
    for args in (
        ["--engine", "tgi"],
        ["--engine-version", "1.0"],
        ["--max-bs", "0"],
        ["--gpu", "V100"],
    ):
        result = cgtool("schedule", *args)
        assert result.exit_code == 2, args
        assert "Traceback" not in result.output
