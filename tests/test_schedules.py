import pytest

from cgtool.errors import CgtoolError
from cgtool.planner.schedules import (
    default_schedule,
    known_versions,
    resolve_version,
    server_args_max_bs,
    sglang_gpu_defaults,
    vllm_default_max_num_seqs,
)
from cgtool.specs.gpus import gpu_spec

H100 = gpu_spec("H100-80GB").memory_bytes


def _steps(*ranges: tuple[int, int, int]) -> list[int]:
    return [v for start, stop, step in ranges for v in range(start, stop + 1, step)]


def test_sglang_decode_list_matches_the_documented_generator():
    # seed 000 section 10.1: [1, 2, 4, 8, 12] + range(16, 257, 8) + range(272, 512, 16) + range(512, max+1, 32)
    expected = [1, 2, 4, 8, 12] + _steps((16, 256, 8), (272, 496, 16), (512, 640, 32))
    for version in known_versions("sglang"):
        assert list(default_schedule("sglang", version, max_bs=640).decode_bs) == expected


def test_sglang_decode_list_ends_at_an_off_grid_max_bs():
    assert default_schedule("sglang", max_bs=100).decode_bs[-3:] == (88, 96, 100)


@pytest.mark.parametrize(
    "version, expected",
    [
        # seed 004 / 001 step table: 4-32 by 4, 48-256 by 16, 288-512 by 32, 576-1024 by 64, 1280-4096 by 256
        (
            "0.5.10",
            _steps((4, 32, 4), (48, 256, 16), (288, 512, 32), (576, 1024, 64), (1280, 4096, 256)),
        ),
        # seed 003: 4-32 by 4, 48-256 by 16, 288-512 by 32, 640-4096 by 128
        ("0.5.4", _steps((4, 32, 4), (48, 256, 16), (288, 512, 32), (640, 4096, 128))),
        # seed 000: [16, 32, 64, 128, 256] + range(512, 4097, 256)
        ("0.5.3.dev", [16, 32, 64, 128, 256] + _steps((512, 4096, 256))),
    ],
)
def test_each_sglang_release_reproduces_its_documented_token_schedule(version, expected):
    assert list(default_schedule("sglang", version, max_tokens=4096).piecewise_tokens) == expected


def test_token_schedule_above_4096_uses_each_release_step():
    assert default_schedule("sglang", "0.5.10", max_tokens=6000).piecewise_tokens[-4:] == (
        4096,
        4608,
        5120,
        5632,
    )
    assert default_schedule("sglang", "0.5.4", max_tokens=4700).piecewise_tokens[-2:] == (
        4352,
        4608,
    )


def test_newer_releases_default_max_tokens_to_the_chunked_prefill_size():
    assert default_schedule("sglang", "0.5.10", gpu_memory_bytes=H100).max_tokens == 8192
    assert default_schedule("sglang", "0.5.4", gpu_memory_bytes=H100).max_tokens == 4096
    assert default_schedule("sglang", "0.5.23", chunked_prefill_size=2048).max_tokens == 2048


@pytest.mark.parametrize(
    "version, gpu, expected",
    [
        ("0.5.10", "H100-80GB", (8192, 256)),
        ("0.5.10", "H200", (8192, 256)),
        ("0.5.10", "B200", (16384, 512)),
        ("0.5.10", "A100-40GB", (4096, 32)),
        ("0.5.10", "RTX-4090", (2048, 24)),
        ("0.5.23", "RTX-4090", (4096, 48)),
        ("0.5.4", "L4", (2048, 16)),
    ],
)
def test_sglang_gpu_tiers(version, gpu, expected):
    assert sglang_gpu_defaults(version, gpu_spec(gpu).memory_bytes) == expected


def test_large_tensor_parallel_raises_the_default_max_bs():
    assert sglang_gpu_defaults("0.5.10", H100, tp_size=8) == (8192, 512)


def test_0523_clips_default_max_bs_in_its_arguments_and_0510_at_run_time():
    new = default_schedule("sglang", "0.5.23", gpu_memory_bytes=H100, max_running_requests=64)
    old = default_schedule("sglang", "0.5.10", gpu_memory_bytes=H100, max_running_requests=64)
    assert new.max_bs == old.max_bs == 64
    # 0.5.10's own arguments keep 256: its memory reserve counts that (server_args_max_bs).
    assert server_args_max_bs("0.5.10", H100, 1, 64) == 256
    assert server_args_max_bs("0.5.23", H100, 1, 64) == 64


def test_vllm_default_on_h100_is_one_token_list_up_to_512():
    schedule = default_schedule("vllm", gpu_memory_bytes=H100)
    assert list(schedule.decode_bs) == [1, 2, 4] + _steps((8, 248, 8), (256, 512, 16))
    assert schedule.piecewise_tokens == schedule.decode_bs
    assert schedule.chunked_prefill_size == 8192


def test_vllm_small_gpu_uses_smaller_batch_defaults():
    schedule = default_schedule("vllm", gpu_memory_bytes=gpu_spec("L4").memory_bytes)
    assert schedule.chunked_prefill_size == 2048 and schedule.max_bs == 512


def test_older_sglang_drops_decode_sizes_above_the_running_limit_and_appends_it():
    old = default_schedule("sglang", "0.5.10", gpu_memory_bytes=H100, max_running_requests=50)
    assert old.decode_bs[-3:] == (40, 48, 50) and old.max_bs == 50
    new = default_schedule("sglang", "0.5.23", gpu_memory_bytes=H100, max_running_requests=50)
    assert new.max_bs == 50 and max(new.decode_bs) == 50


def test_vllm_excludes_a100s_by_name_from_the_large_gpu_defaults():
    # vllm 0.33 engine/arg_utils.py: >= 70 GiB and "a100" not in the device name.
    a100 = gpu_spec("A100-80GB")
    small = default_schedule("vllm", gpu_memory_bytes=a100.memory_bytes, gpu_name=a100.name)
    large = default_schedule("vllm", gpu_memory_bytes=a100.memory_bytes)
    assert small.chunked_prefill_size == 2048 and large.chunked_prefill_size == 8192


def test_vllm_max_bs_caps_the_list():
    assert default_schedule("vllm", max_bs=20).decode_bs == (1, 2, 4, 8, 16)


def test_trtllm_default_lists_every_size_to_31_then_powers_of_two():
    schedule = default_schedule("trtllm")
    assert list(schedule.decode_bs) == list(range(1, 32)) + [32, 64, 128]
    assert not schedule.pads and schedule.piecewise_tokens == ()
    assert default_schedule("trtllm", max_bs=1000).decode_bs[-4:] == (128, 256, 512, 1000)


def test_version_defaults_to_newest_and_unknown_versions_are_refused():
    assert resolve_version("sglang", None) == "0.5.23"
    with pytest.raises(CgtoolError, match="0.5.99") as exc:
        resolve_version("sglang", "0.5.99")
    assert "0.5.10" in exc.value.remedy


def test_unknown_engine_and_bad_limits_are_refused():
    with pytest.raises(CgtoolError, match="--engine"):
        default_schedule("tgi")
    with pytest.raises(CgtoolError, match="--max-bs"):
        default_schedule("sglang", max_bs=0)


def test_vllm_default_max_num_seqs_is_1024_on_large_gpus_and_256_elsewhere():
    a100 = gpu_spec("A100-80GB")
    assert vllm_default_max_num_seqs(H100, "H100-80GB") == 1024
    assert vllm_default_max_num_seqs(a100.memory_bytes, a100.name) == 256
    assert vllm_default_max_num_seqs(gpu_spec("L4").memory_bytes) == 256
