import json
from pathlib import Path

from cli_run import cgtool

EXAMPLE = Path(__file__).parent.parent / "examples" / "azure-conv-first-1000.jsonl"


def test_compare_plan_says_which_of_its_sizes_the_engine_would_not_capture(tmp_path):
    first = cgtool("plan", "--trace", EXAMPLE, "--gpu", "H100-80GB", "--out", tmp_path / "old")
    assert first.exit_code == 0, first.output
    path = tmp_path / "old" / "plan.json"
    old = json.loads(path.read_text())
    chunk = old["inputs"]["chunked_prefill_size"]
    old["piecewise"]["capture_num_tokens"] = [64, 512]  # below the chunk: 0.5.23's BCG keeps the eager peak
    old["piecewise"]["max_num_tokens"] = 512
    path.write_text(json.dumps(old))
    result = cgtool("plan", "--trace", EXAMPLE, "--gpu", "H100-80GB", "--json", "--compare-plan", path)
    assert result.exit_code == 0, result.output
    warnings = json.loads(result.stdout)["warnings"]
    assert f"--compare-plan plan.json: prefill ceiling 512 is below --chunked-prefill-size {chunk}: " \
        "SGLang 0.5.23's breakable graphs then keep the eager peak too" in warnings


REPORT = Path(__file__).parent / "data" / "reports" / "h100-llama-3.1-8b" / "report.json"


def test_plan_names_the_release_prefill_backend_and_a_profile_of_another():
    result = cgtool("plan", "--trace", EXAMPLE, "--gpu", "H100-80GB", "--profile", REPORT, "--json")
    assert result.exit_code == 0, result.output
    warnings = json.loads(result.stdout)["warnings"]
    # The fixture report predates --prefill-backend: its prefill rows are torch.compile pieces.
    assert any(w.startswith("the --profile report measured torch.compile piecewise prefill graphs; "
                            "SGLang 0.5.23 records breakable ones") for w in warnings)
    plain = json.loads(cgtool("plan", "--trace", EXAMPLE, "--gpu", "H100-80GB", "--engine-version", "0.5.10",
                              "--json").stdout)["warnings"]
    assert not any("prefill graphs" in w for w in plain)


def test_compare_plan_scores_an_old_decode_size_above_every_batch_of_the_trace(tmp_path):
    old = json.loads((Path(__file__).parent / "data" / "plans" / "plan-1.3-example.json").read_text())
    ceiling = old["inputs"]["max_running_requests"] + 8  # past the trace's batch histogram
    old["decode"]["capture_bs"] = [ceiling]
    (tmp_path / "plan.json").write_text(json.dumps(old))
    result = cgtool("plan", "--trace", EXAMPLE, "--gpu", "H100-80GB", "--json", "--compare-plan",
                    tmp_path / "plan.json")
    assert result.exit_code == 0, result.output
    rows = {r["schedule"]: r for r in json.loads(result.stdout)["scenarios"]}
    # Every decode step pads up to the one old graph, whose pool is sized for the larger batch.
    assert rows["current"]["decode_coverage"] == 1.0
    assert rows["current"]["graph_bytes"] > rows["plan"]["graph_bytes"]
