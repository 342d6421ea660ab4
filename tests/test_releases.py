"""Release rows against numbers read from each release's own files.

Each expected value below was read by hand from the file named beside it (not computed by
cgtool's code):
- sglang 0.5.23 (PyPI wheel sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl; the wheel
  names no commit):
  sglang/srt/model_executor/cuda_graph_config.py (sha256 0f6774dd...): `default_prefill_backend`
  returns Backend.BREAKABLE on CUDA; Backend.ALL = (full, breakable, disabled).
  sglang/srt/arg_groups/cuda_graph_hook.py (sha256 01f995a3...): generate_prefill_cuda_graph_
  batch_sizes = 4..32/4, 48..256/16, 288..512/32, 576..1024/64, 1280..4096/256, 4608../512,
  filtered to <= max_bs, max_bs not appended.
  sglang/srt/arg_groups/memory_hook.py (sha256 0236a5e0...): the 20-35 GB tier is chunk 4096,
  decode max_bs 48 (tp < 4) / 160; prefill max_bs defaults to chunked_prefill_size; the
  reserve adds len(prefill bs) * 8 MB.
  sglang/srt/environ.py (sha256 967ede87...): SGLANG_ENABLE_POST_CAPTURE_KV_SIZING = EnvBool(False).
- vllm 0.33.0 (PyPI wheel; vllm/_version.py commit_id 'g4ba787ec9'):
  vllm/config/vllm.py _set_cudagraph_sizes: min(max_num_seqs * 2, 512) capped at
  max_num_batched_tokens; [1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16);
  vllm/envs.py: VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS default "1";
  vllm/config/cache.py: gpu_memory_utilization default 0.92.
- TensorRT-LLM main, stored tensorrt_llm/llmapi/llm_args.py at commit 0004396720054fd8:
  enable_padding: [1, 2, 4] + [8 * i for i in 1..16], then +64 while <= max_batch_size,
  max_batch_size appended when off the list; default max_batch_size 128.
"""

import pytest

from cgtool.errors import CgtoolError
from cgtool.planner.memory import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
from cgtool.planner.releases import (
    RELEASE_RULES,
    off_grid_ceilings,
    prefill_notes,
    release_rules,
    through_chunk,
)
from cgtool.planner.schedules import (
    check_limits,
    default_schedule,
    known_versions,
    sglang_gpu_defaults,
    trtllm_padded_batch_sizes,
)
from cgtool.specs.gpus import gpu_spec


def test_every_known_release_has_a_row_with_a_source():
    for engine in ("sglang", "vllm", "trtllm"):
        for version in known_versions(engine):
            rules = release_rules(engine, version)
            assert rules.sources and all(s.repo and s.path and s.at for s in rules.sources)


def test_sglang_0523_prefill_graphs_are_breakable_and_older_ones_torch_compile():
    assert release_rules("sglang", "0.5.23").prefill_backend == "breakable"
    assert release_rules("sglang", "0.5.10").prefill_backend == "torch.compile piecewise"
    assert release_rules("sglang", "0.5.10").prefill_on_by_default
    assert not release_rules("sglang", "0.5.4").prefill_on_by_default


def test_sglang_0523_prefill_list_read_from_cuda_graph_hook():
    # max_bs 6000 (off the grid): the list stops at 5632, 6000 itself is not appended.
    tokens = default_schedule("sglang", "0.5.23", max_tokens=6000).piecewise_tokens
    assert tokens[:8] == (4, 8, 12, 16, 20, 24, 28, 32)
    assert tokens[8:10] == (48, 64) and 1280 in tokens and 1152 not in tokens
    assert tokens[-3:] == (4608, 5120, 5632)


def test_sglang_0523_32gb_tier_read_from_memory_hook():
    assert sglang_gpu_defaults("0.5.23", gpu_spec("RTX-4090").memory_bytes) == (4096, 48)
    assert sglang_gpu_defaults("0.5.23", gpu_spec("RTX-4090").memory_bytes, tp_size=4) == (4096, 160)


def test_sglang_0523_prefill_ceiling_defaults_to_the_chunk():
    assert default_schedule("sglang", "0.5.23", chunked_prefill_size=8192).max_tokens == 8192


def test_post_capture_kv_sizing_is_assumed_off_as_0523_ships_it():
    (env,) = release_rules("sglang", "0.5.23").env
    assert (env.name, env.assumed) == ("SGLANG_ENABLE_POST_CAPTURE_KV_SIZING", "0")


def test_vllm_033_ceiling_read_from_set_cudagraph_sizes():
    # max_num_seqs 100 -> min(200, 512) = 200, under the default 2048-token budget of a small GPU.
    schedule = default_schedule("vllm", "0.33", max_running_requests=100,
                                gpu_memory_bytes=gpu_spec("L4").memory_bytes)
    assert schedule.decode_bs[:4] == (1, 2, 4, 8) and schedule.decode_bs[-2:] == (192, 200)
    # capped at max_num_batched_tokens: 1024 seqs -> 512, then the 256-token budget wins
    capped = default_schedule("vllm", "0.33", max_tokens=256, gpu_memory_bytes=gpu_spec("H100-80GB").memory_bytes)
    assert capped.max_bs == 256


def test_vllm_033_memory_defaults_read_from_envs_and_cache_config():
    (env,) = release_rules("vllm", "0.33").env
    assert (env.name, env.assumed) == ("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "1")
    assert VLLM_DEFAULT_GPU_MEMORY_UTILIZATION == 0.92


def test_trtllm_main_pads_by_64_above_128_and_1_0_by_powers_of_two():
    assert trtllm_padded_batch_sizes(400, "main-0004396")[-6:] == [128, 192, 256, 320, 384, 400]
    assert trtllm_padded_batch_sizes(128, "main-0004396") == [1, 2, 4] + list(range(8, 129, 8))
    assert trtllm_padded_batch_sizes(1000, "1.0")[-4:] == [128, 256, 512, 1000]


def test_capture_through_chunk_applies_to_breakable_releases_only():
    bcg, tc = release_rules("sglang", "0.5.23"), release_rules("sglang", "0.5.10")
    assert through_chunk(bcg, (64, 1024), 8192)[0] == (64, 1024, 8192)
    assert through_chunk(bcg, (64, 8192), 8192) == ((64, 8192), None)
    assert through_chunk(tc, (64, 1024), 8192) == ((64, 1024), None)
    assert through_chunk(bcg, (), 8192) == ((), None)


def test_an_old_plan_off_the_engine_grid_is_named():
    vllm = off_grid_ceilings("vllm", "0.33", (1, 2, 4), (1024, 12288), 8192, 256)
    assert len(vllm) == 1 and "12288" in vllm[0] and "--max-num-batched-tokens 8192" in vllm[0]
    sglang = off_grid_ceilings("sglang", "0.5.23", (1, 8, 300), (64, 1024), 8192, 256)
    assert any("300" in n and "--max-running-requests 256" in n for n in sglang)
    assert any("below --chunked-prefill-size 8192" in n for n in sglang)
    assert off_grid_ceilings("sglang", "0.5.10", (1, 8), (64, 1024), 8192, 256) == []


@pytest.mark.parametrize(("limits", "flag"), [
    ({"max_bs": 10_000_000_000}, "--max-bs"), ({"max_tokens": 10**12}, "--max-tokens"),
    ({"tp_size": 99_999_999_999}, "--tp"), ({"max_bs": 0}, "--max-bs"),
])
def test_limits_past_any_server_are_refused_before_a_list_is_built(limits, flag):
    with pytest.raises(CgtoolError, match=flag):
        check_limits(**limits)


def test_rows_are_keyed_by_engine_and_version():
    assert ("sglang", "0.5.23") in RELEASE_RULES and ("trtllm", "main-0004396") in RELEASE_RULES


def test_a_profile_of_the_other_prefill_backend_is_named():
    notes = prefill_notes("sglang", "0.5.23", (64, 8192), profile_backend="piecewise")
    assert notes == [("the --profile report measured torch.compile piecewise prefill graphs; SGLang 0.5.23 "
                      "records breakable ones (`cgtool capture --prefill-backend breakable` measures those)")]
    assert prefill_notes("sglang", "0.5.23", (64, 8192), profile_backend="breakable") == []
    assert prefill_notes("vllm", "0.33", (64,), profile_backend="breakable")[0].endswith(
        "(`cgtool capture --prefill-backend piecewise` measures those)")
    assert prefill_notes("trtllm", None, (), profile_backend="piecewise") == []
