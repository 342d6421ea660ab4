import json
from pathlib import Path

from cli_run import cgtool


def test_schedule_names_the_release_it_reproduces():
    result = cgtool("schedule")
    assert result.exit_code == 0, result.output
    assert "SGLang 0.5.23 default capture schedule" in result.output
    assert "1 2 4 8 12 16 24" in result.output


def test_schedule_json_for_a_release_and_limits():
    result = cgtool(
        "schedule", "--engine", "sglang", "--engine-version", "0.5.4",
        "--max-bs", "32", "--max-tokens", "1024", "--json",
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


def test_without_gpu_it_shows_the_list_plan_compares_against(monkeypatch):
    import cgtool.commands.plan as plan_cmd
    from cgtool.errors import CgtoolError

    def no_gpu(name):
        if name == "auto":
            raise CgtoolError("no GPU", "name one")
        return real(name)

    real = plan_cmd.gpu_spec
    monkeypatch.setattr(plan_cmd, "gpu_spec", no_gpu)
    shown = json.loads(cgtool("schedule", "--json").stdout)
    example = Path(__file__).parents[1] / "examples" / "azure-conv-first-1000.jsonl"
    planned = json.loads(cgtool("plan", "--trace", example, "--load", "1", "--json").stdout)
    assert shown["decode_bs"] == planned["decode"]["default_capture_bs"]


def test_tp_sets_sglangs_larger_tier_and_a100s_keep_vllms_small_defaults():
    tp4 = json.loads(cgtool("schedule", "--gpu", "H100-80GB", "--tp", "4", "--json").stdout)
    assert tp4["max_bs"] == 512
    a100 = json.loads(cgtool("schedule", "--engine", "vllm", "--gpu", "A100-80GB", "--json").stdout)
    assert a100["chunked_prefill_size"] == 2048


def test_tp_below_one_is_refused_in_one_line():
    result = cgtool("schedule", "--tp", "0")
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == ["error: --tp 0 is not a number of GPUs. Use --tp 1 or more."]


def test_schedule_names_the_prefill_backend_and_rules_with_their_source():
    data = json.loads(cgtool("schedule", "--engine-version", "0.5.23", "--json").stdout)
    rules = data["release_rules"]
    assert rules["prefill_backend"] == "breakable" and rules["capture_through_chunk"] is True
    assert rules["env"][0]["name"] == "SGLANG_ENABLE_POST_CAPTURE_KV_SIZING"
    assert any("cuda_graph_config.py @ v0.5.23 wheel" in s for s in rules["sources"])
    vllm = json.loads(cgtool("schedule", "--engine", "vllm", "--json").stdout)["release_rules"]
    assert any("4ba787ec9" in s for s in vllm["sources"])
    assert "prefill graphs" in cgtool("schedule", "--engine-version", "0.5.10").output


def test_limits_past_any_server_exit_2_in_one_line_at_once():
    for args in (["--tp", "99999999999"], ["--max-bs", "10000000000"], ["--max-tokens", "10000000000"]):
        result = cgtool("schedule", *args)
        assert result.exit_code == 2, args
        assert args[0] in result.output and len(result.output.strip().splitlines()) == 1
