from pathlib import Path

import pytest

from cgtool.planner.flags import FlagValues, flag_names, sglang_flags, trtllm_flags, vllm_flags

DATA = Path(__file__).parent / "data" / "planner"
VALUES = FlagValues(
    decode_bs=(1, 2, 4, 8, 16, 24),
    piecewise_tokens=(64, 256, 1024),
    mem_fraction_static=0.8714,
    gpu_memory_utilization=0.95,
    trtllm_free_fraction=0.9,
    kv_tokens=400_000,
    kv_bytes=52_428_800_000,
    chunked_prefill_size=8192,
    max_running_requests=256,
)
NO_PIECEWISE = FlagValues(
    **{**{f: getattr(VALUES, f) for f in VALUES.__slots__}, "piecewise_tokens": ()}
)
TP2 = FlagValues(**{**{f: getattr(VALUES, f) for f in VALUES.__slots__}, "tp_size": 2})


def _options(name: str) -> set[str]:
    lines = (DATA / f"{name}-options.txt").read_text().splitlines()
    return {line for line in lines if line.startswith("--")}


@pytest.mark.parametrize("version", ["0.5.4", "0.5.10", "0.5.23"])
@pytest.mark.parametrize(
    "values", [VALUES, NO_PIECEWISE, TP2], ids=["piecewise", "no-piecewise", "tp2"]
)
def test_every_sglang_flag_exists_in_that_release_parser(version, values):
    names = flag_names(sglang_flags(values, version))
    assert names and set(names) <= _options(f"sglang-{version}")


def test_0523_uses_per_phase_names_that_0510_lacks():
    new = set(flag_names(sglang_flags(VALUES, "0.5.23")))
    old = set(flag_names(sglang_flags(VALUES, "0.5.10")))
    assert {"--cuda-graph-bs-decode", "--cuda-graph-bs-prefill"} <= new
    assert "--cuda-graph-bs" in old and not old & {
        "--cuda-graph-bs-decode",
        "--cuda-graph-bs-prefill",
    }
    # 0.5.23's parser no longer knows the old names
    assert not {
        "--cuda-graph-bs",
        "--cuda-graph-max-bs",
        "--piecewise-cuda-graph-tokens",
    } & _options("sglang-0.5.23")


def test_sglang_lines_carry_the_values():
    lines = sglang_flags(VALUES, "0.5.23")
    assert "--cuda-graph-bs-decode 1 2 4 8 16 24" in lines
    assert "--piecewise-cuda-graph-max-tokens 1024" in sglang_flags(VALUES, "0.5.10")
    assert "--mem-fraction-static 0.871" in lines
    assert "--max-total-tokens 400000" in lines


def test_0510_piecewise_is_on_by_default_but_0_5_4_needs_enabling():
    assert "--enable-piecewise-cuda-graph" not in sglang_flags(VALUES, "0.5.10")
    assert "--enable-piecewise-cuda-graph" in sglang_flags(VALUES, "0.5.4")
    assert "--disable-piecewise-cuda-graph" in sglang_flags(NO_PIECEWISE, "0.5.10")


def test_0_5_4_takes_token_bins_as_one_json_list():
    assert "--piecewise-cuda-graph-tokens '[64, 256, 1024]'" in sglang_flags(VALUES, "0.5.4")


@pytest.mark.parametrize(
    "values", [VALUES, NO_PIECEWISE, TP2], ids=["piecewise", "no-piecewise", "tp2"]
)
def test_every_vllm_flag_exists_in_its_parser(values):
    assert set(flag_names(vllm_flags(values))) <= _options("vllm-0.33.0")


def test_vllm_captures_the_union_of_decode_sizes_and_token_bins():
    lines = vllm_flags(VALUES)
    assert "--cudagraph-capture-sizes 1 2 4 8 16 24 64 256 1024" in lines
    assert "--max-cudagraph-capture-size 1024" in lines
    assert "--kv-cache-memory-bytes 52428800000" in lines


def test_trtllm_puts_graph_sizes_in_the_options_file():
    lines = trtllm_flags(VALUES)
    assert any("batch_sizes: [1, 2, 4, 8, 16, 24]" in line for line in lines)
    assert "--kv_cache_free_gpu_memory_fraction 0.900" in lines


def test_no_graphs_at_all_turns_them_off_in_every_engine():
    none = FlagValues(
        **{
            **{f: getattr(VALUES, f) for f in VALUES.__slots__},
            "decode_bs": (),
            "piecewise_tokens": (),
        }
    )
    assert {"--disable-decode-cuda-graph", "--disable-prefill-cuda-graph"} <= set(
        flag_names(sglang_flags(none))
    )
    assert "--enforce-eager" in vllm_flags(none)
    assert set(flag_names(vllm_flags(none))) <= _options("vllm-0.33.0")
    assert any("cuda_graph_config: null" in line for line in trtllm_flags(none))


@pytest.mark.parametrize("version", ["0.5.4", "0.5.10", "0.5.23"])
def test_tensor_parallel_size_is_named_in_every_engine_only_above_one_gpu(version):
    assert sglang_flags(TP2, version)[0] == "--tp-size 2"
    assert "--tensor-parallel-size 2" in vllm_flags(TP2)
    assert "--tp_size 2" in trtllm_flags(TP2)
    for lines in (sglang_flags(VALUES, version), vllm_flags(VALUES), trtllm_flags(VALUES)):
        assert not any("tp" in name or "tensor" in name for name in flag_names(lines))


def test_0523_names_the_breakable_backend_and_captures_through_the_chunk():
    # sglang 0.5.23 cuda_graph_config.py: prefill graphs are breakable on CUDA; a ceiling below
    # --chunked-prefill-size (here 1024 < 8192) keeps the eager peak, so the chunk is appended.
    lines = sglang_flags(VALUES, "0.5.23")
    assert "--cuda-graph-backend-prefill breakable" in lines
    assert "--cuda-graph-max-bs-prefill 8192" in lines
    assert "--cuda-graph-bs-prefill 64 256 1024 8192" in lines
    assert any(line.startswith("# prefill graphs captured through --chunked-prefill-size 8192") for line in lines)


def test_0510_torch_compile_pieces_keep_the_plan_ceiling():
    lines = sglang_flags(VALUES, "0.5.10")
    assert "--piecewise-cuda-graph-max-tokens 1024" in lines
    assert not any("captured through" in line for line in lines)


def test_a_ceiling_at_the_chunk_gets_no_extra_size():
    at_chunk = FlagValues(**{**{f: getattr(VALUES, f) for f in VALUES.__slots__},
                             "piecewise_tokens": (64, 256, 8192)})
    assert "--cuda-graph-bs-prefill 64 256 8192" in sglang_flags(at_chunk, "0.5.23")


def test_flags_print_the_environment_setting_the_fraction_assumes():
    sglang = sglang_flags(VALUES, "0.5.23")
    assert any(line.startswith("# assumes SGLANG_ENABLE_POST_CAPTURE_KV_SIZING=0") for line in sglang)
    assert not any("SGLANG_ENABLE_POST_CAPTURE" in line for line in sglang_flags(VALUES, "0.5.10"))
    assert any(line.startswith("# assumes VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1") for line in vllm_flags(VALUES))


def test_vllm_never_gets_a_size_above_its_token_budget():
    # vllm 0.33 config/vllm.py: sizes above max_num_batched_tokens are dropped, and beside an
    # explicit --max-cudagraph-capture-size that makes it refuse to start.
    big = FlagValues(**{**{f: getattr(VALUES, f) for f in VALUES.__slots__},
                        "piecewise_tokens": (64, 8192, 12288)})
    lines = vllm_flags(big)
    assert "--max-cudagraph-capture-size 8192" in lines
    assert not any("12288" in line for line in lines if line.startswith("--"))
    assert "# left out, above --max-num-batched-tokens 8192: 12288" in lines


@pytest.mark.parametrize("version", ["0.5.10", "0.5.23"])
def test_sglang_decode_sizes_above_the_request_pool_become_the_pool_size(version):
    # 0.5.23 runner/base_cuda_graph_runner.py get_batch_sizes_to_capture: sizes above
    # req_to_token_pool.size are filtered out and the pool size added.
    over = FlagValues(**{**{f: getattr(VALUES, f) for f in VALUES.__slots__},
                         "decode_bs": (1, 8, 200, 300), "max_running_requests": 256})
    lines = sglang_flags(over, version)
    expected = "1 8 200 256"
    assert any(line.endswith(expected) and "bs" in line for line in lines)
    assert any(line.startswith("# decode sizes above --max-running-requests 256 (300)") for line in lines)
