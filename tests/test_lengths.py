import json

import numpy as np
import pytest
from cli_run import cgtool

from cgtool.errors import InputError
from cgtool.traces.lengths import has_no_arrivals, read_lengths, with_poisson_arrivals


def sharegpt_csv(tmp_path, n=400, header="prompt_tokens,completion_tokens"):
    rng = np.random.default_rng(1)
    rows = [f"{p},{o}" for p, o in zip(rng.integers(20, 800, n), rng.integers(1, 300, n))]
    path = tmp_path / "sharegpt.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def test_a_csv_of_lengths_reads_in_file_order(tmp_path):
    path = tmp_path / "l.csv"
    path.write_text("id,Input_Len,output_len\na,12,3\nb,40,0\n")
    trace = read_lengths(path)
    assert trace.input_len.tolist() == [12, 40] and trace.output_len.tolist() == [3, 0]
    assert has_no_arrivals(path)


def test_a_csv_with_a_time_column_is_not_taken_for_lengths(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n")
    assert not has_no_arrivals(path)


def test_json_lines_without_arrivals_are_lengths(tmp_path):
    path = tmp_path / "l.jsonl"
    path.write_text('{"input_len": 5, "output_len": 2}\n{"input_len": 7, "output_len": 1, '
                    '"cached_len": 3}\n')
    assert has_no_arrivals(path)
    assert read_lengths(path).cached_len.tolist() == [0, 3]


def test_a_bad_length_names_the_line_and_column(tmp_path):
    path = tmp_path / "l.csv"
    path.write_text("prompt_len,output_len\n10,2\n0,4\n")
    with pytest.raises(InputError, match=r"line 3, field 'prompt_len'"):
        read_lengths(path)


def test_poisson_arrivals_are_seeded_and_keep_the_rate(tmp_path):
    trace = read_lengths(sharegpt_csv(tmp_path, n=4000))
    a, b = (with_poisson_arrivals(trace, 8.0, seed=3) for _ in range(2))
    assert np.array_equal(a.arrival_s, b.arrival_s) and a.arrival_s[0] == 0.0
    assert len(a) / a.arrival_s[-1] == pytest.approx(8.0, rel=0.05)
    assert a.input_len.tolist() == trace.input_len.tolist()  # file order kept


@pytest.mark.parametrize("flag", [["--rate", "4"], ["--concurrency", "24"]])
def test_lengths_plan_with_a_rate_or_a_concurrency(tmp_path, flag):
    result = cgtool("plan", "--trace", sharegpt_csv(tmp_path), "--format", "lengths",
                    "--gpu", "H100-80GB", "--json", *flag)
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert {row["schedule"] for row in plan["closed_loop"]} == {"plan", "default"}
    assert plan["decode"]["capture_bs"]


def test_lengths_without_a_rate_or_concurrency_name_both_flags(tmp_path):
    result = cgtool("plan", "--trace", sharegpt_csv(tmp_path), "--gpu", "H100-80GB")
    assert result.exit_code == 2
    assert "no arrival times" in result.output
    assert "--rate" in result.output and "--concurrency" in result.output
    assert "Traceback" not in result.output


def test_a_rate_for_a_trace_with_arrivals_is_refused(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"arrival": 0.0, "input_len": 5, "output_len": 2}\n')
    result = cgtool("plan", "--trace", path, "--gpu", "H100-80GB", "--rate", "3")
    assert result.exit_code == 2 and "--load" in result.output
