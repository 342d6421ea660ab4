import json
import os
import stat
from pathlib import Path

import pytest
from cli_run import cgtool
from rich.console import Console

from cgtool.commands.plan import parse_bytes
from cgtool.documents.plan_document import Plan
from cgtool.errors import InputError
from cgtool.planner.engine_buffers import engine_graph_buffers
from cgtool.planner.request import PlanRequest
from cgtool.planner.server import server_for
from cgtool.reports.plan_tables import plan_memory_rows
from cgtool.reports.plan_view import memory_table
from cgtool.specs.config import load_model_config
from cgtool.specs.gpus import gpu_spec

ROOT = Path(__file__).parent.parent
EXAMPLE = ROOT / "examples" / "azure-conv-first-1000.jsonl"
REPORT = Path(__file__).parent / "data" / "planner" / "report-h100-llama8b.json"


def test_plan_prints_flags_and_the_comparison():
    result = cgtool("plan", "--trace", EXAMPLE, "--gpu", "H100-80GB")
    assert result.exit_code == 0, result.output
    assert "Recommended flags for SGLang 0.5.23" in result.output
    assert "--cuda-graph-bs-decode" in result.output and "--mem-fraction-static" in result.output
    assert "expected step" in result.output and "default" in result.output


def test_plan_json_is_a_plan_document():
    result = cgtool("plan", "--trace", EXAMPLE, "--gpu", "H100-80GB", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["schema"] == "cgtool.plan" and data["inputs"]["gpu"] == "H100-80GB"
    assert data["decode"]["capture_bs"]


def test_out_writes_plan_json_and_figures(tmp_path):
    result = cgtool("plan", "--trace", EXAMPLE, "--gpu", "H100-80GB", "--out", tmp_path / "p")
    assert result.exit_code == 0, result.output
    names = {p.name for p in (tmp_path / "p").iterdir()}
    assert {"plan.json", "plan_decode.png", "plan_extend.png", "plan_memory.png"} <= names
    assert json.loads((tmp_path / "p" / "plan.json").read_text())["status"] == "complete"
    assert (tmp_path / "p" / "plan_decode.png").read_bytes()[:4] == b"\x89PNG"


def test_vllm_engine_and_release_are_named():
    result = cgtool("plan", "--trace", EXAMPLE, "--gpu", "H100-80GB", "--engine", "vllm")
    assert result.exit_code == 0, result.output
    assert (
        "Recommended flags for vLLM 0.33" in result.output
        and "--cudagraph-capture-sizes" in result.output
    )


def test_older_sglang_release_gets_its_own_flag_names():
    result = cgtool(
        "plan", "--trace", EXAMPLE, "--gpu", "H100-80GB", "--engine-version", "0.5.10", "--json"
    )
    flags = json.loads(result.stdout)["flags"]["sglang"]
    assert any(f.startswith("--cuda-graph-bs ") for f in flags)


def test_auto_gpu_without_one_falls_back_with_a_note(monkeypatch):
    import cgtool.commands.plan as plan_cmd
    from cgtool.errors import CgtoolError

    real = plan_cmd.gpu_spec

    def no_gpu(name):
        if name == "auto":
            raise CgtoolError("no NVIDIA GPU found for --gpu auto")
        return real(name)

    monkeypatch.setattr(plan_cmd, "gpu_spec", no_gpu)
    result = cgtool("plan", "--trace", EXAMPLE, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["inputs"]["gpu"] == "H100-80GB"
    assert any("no GPU found" in w for w in data["warnings"])


def test_profile_report_is_used():
    result = cgtool("plan", "--trace", EXAMPLE, "--gpu", "H100-80GB", "--profile", REPORT, "--json")
    assert result.exit_code == 0, result.output
    memory = json.loads(result.stdout)["memory"]
    assert memory["graph_bytes_measured"] > 0


def test_budgets_are_applied():
    result = cgtool(
        "plan", "--trace", EXAMPLE, "--gpu", "H100-80GB",
        "--budget-graphs", "5", "--budget-memory", "300MiB", "--json",
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert len(data["decode"]["capture_bs"]) + len(data["piecewise"]["capture_num_tokens"]) <= 5
    assert data["memory"]["graph_bytes"] <= 300 << 20


def test_a_malformed_trace_line_names_file_and_line(tmp_path):
    bad = tmp_path / "t.jsonl"
    bad.write_text(
        '{"arrival": 0, "input_len": 10, "output_len": 5}\n{"arrival": 1, "input_len": "x", "output_len": 5}\n'
    )
    result = cgtool("plan", "--trace", bad, "--gpu", "H100-80GB")
    assert result.exit_code == 2
    assert f"{bad}, line 2, field 'input_len'" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "args, words",
    [
        (["--engine", "trtllm"], "--engine trtllm"),
        (["--engine-version", "0.4"], "--engine-version"),
        (["--budget-memory", "lots"], "--budget-memory"),
        (["--gpu", "H900"], "--gpu"),
        (["--model", "nope-7b"], "nope-7b"),
        (["--hidden-states", "some"], "--hidden-states 'some'"),
        (["--attention-backend", "fa4"], "--attention-backend 'fa4'"),
        (["--attention-backend", "fa3", "--engine", "vllm"], "--attention-backend fa3"),
    ],
)
def test_bad_options_exit_2_with_one_line(args, words):
    result = cgtool("plan", "--trace", EXAMPLE, *args)
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    # One error line, naming the flag, and nothing after it (no traceback, no wrapped remedy).
    assert len(errors) == 1 and words in errors[0] and lines[-1] == errors[0]


def test_missing_trace_file_exits_2(tmp_path):
    result = cgtool("plan", "--trace", tmp_path / "none.jsonl", "--gpu", "H100-80GB")
    assert result.exit_code == 2 and "none.jsonl" in result.output


def test_batch_trace_plans_without_simulation(tmp_path):
    trace = tmp_path / "b.jsonl"
    lines = [{"mode": "decode", "batch_size": b, "count": 100 - b} for b in range(1, 60)]
    lines += [{"mode": "extend", "num_tokens": n, "count": 5} for n in range(64, 4096, 97)]
    trace.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    result = cgtool("plan", "--trace", trace, "--gpu", "H100-80GB", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["inputs"]["trace_kind"] == "batches"


def test_azure_csv_plans_directly_with_format(tmp_path):
    csv = tmp_path / "a.csv"
    csv.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
    )
    result = cgtool("plan", "--trace", csv, "--format", "azure", "--gpu", "H100-80GB", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["inputs"]["trace_kind"] == "requests"
    assert data["simulation"]["num_requests"] == 2
    # Each prompt (ContextTokens) arrives alone and is prefilled as one extend step of its length.
    assert data["piecewise"]["histogram"]["sizes"] == [374, 396]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("8GiB", 8 << 30),
        ("512 MiB", 512 << 20),
        ("2e9", 2_000_000_000),
        ("100", 100),
        ("1.5G", 1_500_000_000),
    ],
)
def test_memory_amounts_parse(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "-1GiB", "8 parsecs", "nan"])
def test_bad_memory_amounts_are_refused(text):
    with pytest.raises(InputError, match="--budget-memory"):
        parse_bytes(text)


def test_sglang_server_log_plans_as_batches(tmp_path):
    log = tmp_path / "server.log"
    lines = []
    for i in range(40):
        lines.append(
            f"[2025-09-03 05:49:{i:02d}] Prefill batch. #new-seq: 1, #new-token: {100 + 37 * i}, #cached-token: 0, "
            "token usage: 0.02, #running-req: 0, #queue-req: 0,"
        )
        lines.append(
            f"[2025-09-03 05:49:{i:02d}] Decode batch. #running-req: {1 + i % 13}, #token: 501, token usage: 0.02, "
            "cuda graph: True, gen throughput (token/s): 65.75, #queue-req: 0,"
        )
    log.write_text("\n".join(lines) + "\n")
    result = cgtool(
        "plan", "--trace", log, "--format", "sglang-log", "--gpu", "H100-80GB", "--json"
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["inputs"]["trace_kind"] == "batches"
    # Batch 13 is the largest logged; decode graphs reach past it, on SGLang's list.
    assert data["decode"]["capture_bs"][0] == 1
    assert 13 <= max(data["decode"]["capture_bs"]) <= 24


def test_tp_plans_each_gpu_and_names_the_tp_flags():
    result = cgtool("plan", "--trace", EXAMPLE, "--gpu", "H100-80GB", "--tp", "2")
    assert result.exit_code == 0, result.output
    assert "--tp-size 2 \\" in result.output and "--tensor-parallel-size 2 \\" in result.output
    assert "Memory per GPU of 2 × H100-80GB (--tp 2)" in result.output
    assert "all-reduces (estimated)" in result.output
    as_json = cgtool("plan", "--trace", EXAMPLE, "--gpu", "H100-80GB", "--tp", "2", "--json")
    data = json.loads(as_json.stdout)
    assert data["inputs"]["tp_size"] == 2 and data["memory"]["kv_heads_per_rank"] == 4


def test_one_gpu_output_names_no_tp_flag():
    result = cgtool("plan", "--trace", EXAMPLE, "--gpu", "H100-80GB")
    assert "--tp-size" not in result.output and "Memory on H100-80GB (" in result.output


@pytest.mark.parametrize(
    "tp, words",
    [("0", "--tp 0 is not a number of GPUs"), ("3", "--tp 3 does not divide"), ("16", "--tp 16")],
)
def test_bad_tp_exits_2_with_one_line_naming_the_sizes_that_work(tp, words):
    result = cgtool("plan", "--trace", EXAMPLE, "--gpu", "H100-80GB", "--tp", tp)
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert words in lines[0] and "Use --tp 1, 2, 4 or 8" in lines[0]
    assert "Traceback" not in result.output


def test_a_plan_written_before_tp_renders_as_one_gpu():
    from rich.console import Console

    from cgtool.reports.plan_view import plan_view

    old = json.loads(cgtool("plan", "--trace", EXAMPLE, "--gpu", "H100-80GB", "--json").stdout)
    del old["inputs"]["tp_size"], old["memory"]["tp_size"], old["memory"]["kv_heads_per_rank"]
    for row in old["comparison"]:
        del row["comm_ms"]
    console = Console(width=200, record=True)
    console.print(plan_view(Plan.from_dict(old)))
    text = console.export_text()
    assert "Memory on H100-80GB" in text and "all-reduces" not in text


def _plan_out(folder, *extra):
    result = cgtool("plan", "--trace", EXAMPLE, "--gpu", "H100-80GB", "--out", folder, *extra)
    assert result.exit_code == 0, result.output
    return result


def test_out_files_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        _plan_out(tmp_path / "p")
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "p").iterdir()}
    assert modes["plan.json"] == 0o644 and set(modes.values()) == {0o644}, modes


def test_out_writes_the_trtllm_options_file_its_flags_name(tmp_path):
    result = _plan_out(tmp_path / "p", "--json")
    flags = json.loads(result.stdout)["flags"]["trtllm"]
    named = next(f.split()[1] for f in flags if f.startswith("--extra_llm_api_options"))
    written = (tmp_path / "p" / named).read_text()
    assert written.startswith("cuda_graph_config:") and f"# {named}: {written.strip()}" in flags


def test_out_lists_every_file_it_wrote(tmp_path):
    result = _plan_out(tmp_path / "p")
    for path in (tmp_path / "p").iterdir():
        assert f"wrote {path}" in result.stdout


def test_unknown_engine_version_is_refused_before_the_trace_is_read(monkeypatch):
    def must_not_read(*args, **kwargs):
        raise AssertionError("the trace was read before --engine-version was checked")

    import cgtool.commands.plan as plan_cmd

    monkeypatch.setattr(plan_cmd, "load_trace_hinted", must_not_read)
    result = cgtool("plan", "--trace", EXAMPLE, "--engine-version", "9.9")
    assert result.exit_code == 2
    assert "no sglang release '9.9'" in result.stderr and "reading" not in result.stderr


def test_azure_csv_without_format_hints_the_format(tmp_path):
    csv = tmp_path / "azure.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                   "2023-11-16 18:15:46.6805900,374,44\n")
    result = cgtool("plan", "--trace", csv)
    assert result.exit_code == 2
    assert "pass --format azure" in result.stderr


def test_memory_table_fills_the_engine_default_column():
    result = cgtool("plan", "--trace", EXAMPLE, "--gpu", "H100-80GB", "--json")
    fitted = memory_table(Plan.from_dict(json.loads(result.stdout)))
    (table,) = fitted.tables(Console(width=200), 200)
    default = table.columns[2]
    assert default.header == "engine default"
    assert all(str(cell).strip() for cell in default._cells), list(default._cells)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--load", "0"], "--load"),
        (["--load", "1,x"], "--load"),
        (["--replicas", "-1"], "--replicas"),
        (["--replicas", "0"], "--replicas"),
        (["--compare-plan", REPORT], "not a plan"),
    ],
)
def test_bad_load_replicas_and_compare_plan_exit_2_with_one_sentence(args, words):
    result = cgtool("plan", "--trace", EXAMPLE, "--gpu", "H100-80GB", *args)
    assert result.exit_code == 2, result.output
    assert words in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_plan_shows_every_load_and_the_basis_of_its_prediction():
    result = cgtool("plan", "--trace", EXAMPLE, "--gpu", "H100-80GB", "--load", "1,3")
    assert result.exit_code == 0, result.output
    assert "held-out traffic" in result.output and "predictions" in result.output
    assert "│ 3x" in result.output and "eager cost, high" in result.output


def test_compare_plan_scores_an_existing_plan_on_this_trace(tmp_path):
    first = cgtool("plan", "--trace", EXAMPLE, "--gpu", "H100-80GB", "--out", tmp_path / "old")
    assert first.exit_code == 0, first.output
    result = cgtool(
        "plan", "--trace", EXAMPLE, "--gpu", "H100-80GB", "--json",
        "--compare-plan", tmp_path / "old" / "plan.json",
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert any(r["schedule"] == "current" for r in data["scenarios"])
    assert data["inputs"]["compare_plan"].endswith("plan.json")


def test_compare_plan_prints_a_verdict_and_names_an_old_plan_for_another_engine(tmp_path):
    old = json.loads((ROOT / "tests" / "data" / "plans" / "plan-1.3-example.json").read_text())
    old["inputs"]["engine"] = "vllm"
    (tmp_path / "plan.json").write_text(json.dumps(old))
    result = cgtool("plan", "--trace", EXAMPLE, "--gpu", "H100-80GB",
                    "--compare-plan", tmp_path / "plan.json")
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "--compare-plan's plan was made for another deployment: engine vllm (now sglang)" in text
    assert "no verdict: the old plan was made for another deployment" in text


def test_hidden_states_grow_the_graph_memory_and_shrink_the_fraction_with_a_note():
    plans = {}
    for mode in ("null", "last", "full"):
        result = cgtool("plan", "--trace", EXAMPLE, "--gpu", "H100-80GB", "--json", "--hidden-states", mode)
        assert result.exit_code == 0, result.output
        plans[mode] = json.loads(result.stdout)
    graph = {mode: plan["memory"]["graph_bytes"] for mode, plan in plans.items()}
    assert graph["null"] < graph["last"] <= graph["full"]
    assert plans["full"]["memory"]["mem_fraction_static"] <= plans["null"]["memory"]["mem_fraction_static"]
    assert not any("hidden-state mode" in w for w in plans["null"]["warnings"])
    assert any("hidden-state mode full" in w for w in plans["full"]["warnings"])


def test_attention_backend_buffers_are_in_graph_memory_plan_json_and_the_table():
    plans = {}
    for backend in ("fa3", "triton"):
        result = cgtool("plan", "--trace", EXAMPLE, "--gpu", "H100-80GB", "--json",
                        "--attention-backend", backend)
        assert result.exit_code == 0, result.output
        plans[backend] = Plan.from_dict(json.loads(result.stdout))
    fa3, triton = plans["fa3"].memory, plans["triton"].memory
    assert (fa3.attention_backend, triton.attention_backend) == ("fa3", "triton")
    assert plans["fa3"].decode.capture_bs == plans["triton"].decode.capture_bs
    # Same sizes: the graph memory differs by the backends' buffers, and the fraction follows.
    assert triton.graph_bytes - fa3.graph_bytes == triton.attention_buffer_bytes - fa3.attention_buffer_bytes
    assert triton.attention_buffer_bytes > fa3.attention_buffer_bytes
    assert triton.mem_fraction_static <= fa3.mem_fraction_static
    table = "\n".join(" ".join(row) for row in plan_memory_rows(plans["triton"]).rows)
    assert "triton graph buffers" in table and "static inputs + fp32 logits" in table


def test_default_attention_backend_is_sglangs_for_the_model_and_gpu():
    result = cgtool("plan", "--trace", EXAMPLE, "--gpu", "A100-80GB", "--json")
    assert json.loads(result.stdout)["memory"]["attention_backend"] == "flashinfer"


@pytest.mark.parametrize("version", ["0.5.4", "0.5.10", "0.5.23"])
def test_attention_backend_buffers_are_planned_for_each_checked_sglang_release(version):
    result = cgtool("plan", "--trace", EXAMPLE, "--gpu", "H100-80GB", "--json",
                    "--engine-version", version, "--attention-backend", "triton")
    assert result.exit_code == 0, result.output
    plan = Plan.from_dict(json.loads(result.stdout))
    cfg = load_model_config("llama-3.1-8b")
    expected = engine_graph_buffers(cfg, "triton", max(plan.decode.capture_bs),
                                    cfg.max_context_len, gpu_spec("H100-80GB"), version)
    assert plan.memory.attention_backend == "triton"
    assert plan.memory.attention_buffer_bytes == expected.attention_bytes
    assert plan.memory.static_input_bytes == expected.static_input_bytes


def test_attention_backend_for_an_unchecked_sglang_release_exits_2_in_one_line():
    result = cgtool("plan", "--trace", EXAMPLE, "--engine-version", "0.5.3.dev",
                    "--attention-backend", "fa3")
    assert result.exit_code == 2
    assert "--engine-version" in result.output and len(result.output.strip().splitlines()) == 1


def test_breakable_prefill_graphs_reach_the_chunk_in_plan_json_its_memory_and_its_flags():
    result = cgtool("plan", "--trace", EXAMPLE, "--gpu", "H100-80GB", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    chunk = data["inputs"]["chunked_prefill_size"]
    tokens = data["piecewise"]["capture_num_tokens"]
    # On this trace the optimiser's own ceiling stops below the chunk; SGLang 0.5.23 captures
    # through it, and so does the plan.
    assert tokens[-1] == chunk and tokens[-2] < chunk
    assert f"--cuda-graph-bs-prefill {' '.join(map(str, tokens))}" in data["flags"]["sglang"]
    cost = server_for(PlanRequest(load_model_config("llama-3.1-8b"), gpu_spec("H100-80GB"))).cost
    assert data["memory"]["graph_bytes"] == cost.graph_bytes(data["decode"]["capture_bs"], tokens)
    assert any(w.startswith(f"prefill graphs captured through --chunked-prefill-size {chunk}")
               for w in data["warnings"])


def test_a_plan_from_three_requests_warns_that_it_is_a_guess(tmp_path):
    csv = tmp_path / "tiny.csv"
    csv.write_text("input_len,output_len\n374,44\n396,109\n879,55\n")
    result = cgtool("plan", "--trace", csv, "--format", "lengths", "--rate", "2", "--gpu", "H100-80GB")
    assert result.exit_code == 0, result.output
    assert "only 3 requests" in " ".join(result.output.split())
