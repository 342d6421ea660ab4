from pathlib import Path

import pytest
from cli_run import cgtool

from cgtool.errors import CgtoolError, InputError
from cgtool.planner.bounds import max_running_bound
from cgtool.planner.memory import plan_memory
from cgtool.planner.request import PlanRequest
from cgtool.specs.config import load_model_config
from cgtool.specs.gpus import gpu_spec
from cgtool.units import GIB

EXAMPLE = Path(__file__).parent.parent / "examples" / "azure-conv-first-1000.jsonl"
LLAMA = load_model_config("llama-3.1-8b")
H100 = gpu_spec("H100-80GB")

# llama-3.1-8b on one H100-80GB, from the config, the datasheet and the margin's measured
# parts (cgtool.planner.margin), by hand:
#   parameters  2 x 128,256 x 4,096 (embedding, LM head) + 32 x (2 x 4,096^2 + 2 x 4,096 x 1,024
#               + 3 x 4,096 x 14,336 + 2 x 4,096) + 4,096 = 8,030,261,248 -> 16,060,522,496 B bf16
#   memory      81,559 MiB = 85,521,448,960 B
#   margin that no limit scales: CUDA context 619 MiB + cuBLAS 136 MiB + first forward 165 MiB
#               + headroom 1.5 GiB = 2,575,302,656 B
#   room        85,521,448,960 - 16,060,522,496 - 2,575,302,656 = 66,885,623,808 B
# One running request at SGLang:
#   req_to_token row 131,072 x 4 B = 524,288; one KV token 32 x 2 x 8 x 128 x 2 B = 131,072;
#   eager activations (4 x 4,096 + 4,096 + 2 x 1,024 + 3 x 14,336) x 2 B = 131,072; the decode
#   kernel's fp32 partials 32 heads x 16 splits x 129 x 4 B = 264,192; the sampler's logits
#   128,256 x 12.1 B = 1,551,897  -> 2,602,521 B
#   66,885,623,808 // 2,602,521 = 25,700
LLAMA_H100_MAX_RUNNING = 25_700


def test_max_running_bound_is_what_the_gpu_holds_by_hand():
    assert max_running_bound(LLAMA, H100, "sglang") == LLAMA_H100_MAX_RUNNING


def test_the_bound_admits_the_engines_own_defaults_and_refuses_one_more():
    # SGLang's default request pool tops out at 4,096, vLLM's max_num_seqs at 1,024.
    for value in (4096, LLAMA_H100_MAX_RUNNING):
        PlanRequest(cfg=LLAMA, gpu=H100, max_running_requests=value)
    with pytest.raises(InputError, match="--max-running-requests 25701 .* at most 25,700"):
        PlanRequest(cfg=LLAMA, gpu=H100, max_running_requests=LLAMA_H100_MAX_RUNNING + 1)


@pytest.mark.parametrize("value", ["99999999999999999999", "10000000000", "100000000"])
def test_huge_max_running_requests_is_one_line_exit_2_before_the_trace_is_read(value):
    # Before: a traceback, a 74.5 GiB allocation traceback, and 14 s / 5.5 GB ending in an
    # error that named --chunked-prefill-size.
    result = cgtool("plan", "--trace", EXAMPLE, "--max-running-requests", value)
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: --max-running-requests {value} ")
    assert "Pass --max-running-requests 25700 or less" in lines[0]


def test_huge_chunked_prefill_size_is_one_line_exit_2():
    result = cgtool("plan", "--trace", EXAMPLE, "--chunked-prefill-size", "10000000000")
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--chunked-prefill-size 10000000000" in lines[0]


def _no_room(cfg):
    return plan_memory(
        cfg, 16 * GIB, graph_bytes=GIB, chunked_prefill_size=8192, max_running_requests=256,
        peak_kv_demand_tokens=0, typical_request_tokens=100, default_mem_fraction_static=0.8,
    )


def test_does_not_fit_suggests_tp_only_for_models_tp_can_split():
    with pytest.raises(CgtoolError) as dense:
        _no_room(LLAMA)
    with pytest.raises(CgtoolError) as moe:
        _no_room(load_model_config("qwen3-30b-a3b"))
    assert "--tp" in dense.value.remedy and "--max-running-requests" in dense.value.remedy
    assert "--tp" not in moe.value.remedy and "tensor parallelism" not in moe.value.remedy
