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
