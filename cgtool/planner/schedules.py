"""The capture lists each engine builds by itself, release by release.

A plan is only worth its graphs if it beats what the engine would capture unaided, so these
rules reproduce the engines' own generators. Each SGLang entry names the release whose
`server_args` it was read from; the seed documents disagree on the piecewise schedule
because they describe different releases (see `SGLANG_RELEASES`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from cgtool.errors import CgtoolError
from cgtool.units import GIB, MIB

ENGINES = ("sglang", "vllm", "trtllm")


@dataclass(frozen=True, slots=True)
class EngineSchedule:
    engine: str
    version: str
    decode_bs: tuple[int, ...]  # batch sizes of full decode graphs
    piecewise_tokens: tuple[int, ...]  # token counts of extend graphs; () when none
    max_bs: int
    max_tokens: int
    piecewise_on_by_default: bool
    chunked_prefill_size: int  # the engine's per-step token budget under these limits
    source: str  # where the rule comes from
    pads: bool = True  # False: a batch off the list runs eagerly instead of padding up


def sglang_decode_bs(max_bs: int) -> list[int]:
    # Same generator in every SGLang release cgtool knows (server_args
    # _generate_cuda_graph_batch_sizes, no speculative decoding, padding on).
    sizes = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16))
    sizes += list(range(512, max_bs + 1, 32))
    sizes = [s for s in sizes if s <= max_bs]
    if max_bs not in sizes:
        sizes.append(max_bs)
    return sizes


def _tokens_seed000(max_tokens: int) -> list[int]:
    sizes = [16, 32, 64, 128, 256] + list(range(512, 4097, 256))
    return [s for s in sizes + list(range(4352, max_tokens + 1, 256)) if s <= max_tokens]


def _tokens_054(max_tokens: int) -> list[int]:
    sizes = list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
    sizes += list(range(640, 4097, 128)) + list(range(4352, max_tokens + 1, 256))
    return [s for s in sizes if s <= max_tokens]


def _tokens_0510(max_tokens: int) -> list[int]:
    sizes = list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
    sizes += list(range(576, 1025, 64)) + list(range(1280, 4097, 256))
    sizes += list(range(4608, max_tokens + 1, 512))
    return [s for s in sizes if s <= max_tokens]


# (GPU memory below MiB, chunked_prefill_size, max_bs at tp < 4, max_bs at tp >= 4); the
# last row has no bound. Read from each release's _handle_gpu_memory_settings.
_Tiers = tuple[tuple[float, int, int, int], ...]
_TIERS_054: _Tiers = (
    (20 * 1024, 2048, 8, 8),
    (35 * 1024, 2048, 16, 80),
    (60 * 1024, 4096, 32, 160),
    (90 * 1024, 8192, 256, 512),
    (160 * 1024, 8192, 256, 512),
    (math.inf, 16384, 512, 512),
)
_TIERS_0510: _Tiers = ((20 * 1024, 2048, 8, 8), (35 * 1024, 2048, 24, 80)) + _TIERS_054[2:]
_TIERS_0523: _Tiers = ((20 * 1024, 2048, 8, 8), (35 * 1024, 4096, 48, 160)) + _TIERS_054[2:]


@dataclass(frozen=True, slots=True)
class SglangRelease:
    version: str
    tokens_rule: Callable[[int], list[int]]
    tiers: _Tiers
    piecewise_on_by_default: bool
    max_tokens_is_chunk: bool  # else a fixed default of 4096
    per_phase_flags: bool  # --cuda-graph-bs-decode ... instead of --cuda-graph-bs ...
    tokens_flag_json: bool  # --piecewise-cuda-graph-tokens takes one JSON list, not ints
    caps_max_bs_at_running: bool  # decode max_bs default clipped to --max-running-requests
    counts_piecewise_reserve: bool  # default mem-fraction reserves 8 MB per token size
    source: str


# Each release is written as what changed since the one before it, so a fact stated once
# holds until a later release changes it.
_SGLANG_053_DEV = SglangRelease(
    version="0.5.3.dev",
    tokens_rule=_tokens_seed000,
    tiers=_TIERS_054,
    piecewise_on_by_default=False,
    max_tokens_is_chunk=False,
    per_phase_flags=False,
    tokens_flag_json=True,
    caps_max_bs_at_running=False,
    counts_piecewise_reserve=False,
    source="seed 000 (section 10); a development state no PyPI release carries",
)
_SGLANG_054 = replace(
    _SGLANG_053_DEV,
    version="0.5.4",
    tokens_rule=_tokens_054,
    source="sglang 0.5.4 server_args (same rule in 0.5.3.post2 and 0.5.6); seed 003",
)
_SGLANG_0510 = replace(
    _SGLANG_054,
    version="0.5.10",
    tokens_rule=_tokens_0510,
    tiers=_TIERS_0510,
    piecewise_on_by_default=True,
    max_tokens_is_chunk=True,
    tokens_flag_json=False,
    counts_piecewise_reserve=True,
    source="sglang 0.5.10 server_args; seeds 001 and 004",
)
_SGLANG_0523 = replace(
    _SGLANG_0510,
    version="0.5.23",
    tiers=_TIERS_0523,
    per_phase_flags=True,
    caps_max_bs_at_running=True,
    source="sglang 0.5.23 arg_groups/memory_hook.py and cuda_graph_hook.py",
)
SGLANG_RELEASES: dict[str, SglangRelease] = {
    r.version: r for r in (_SGLANG_053_DEV, _SGLANG_054, _SGLANG_0510, _SGLANG_0523)
}
VLLM_VERSIONS = ("0.33",)
# "main-0004396": TensorRT-LLM's main branch at the stored commit 0004396 (after PR 12895); its
# defaults (max_batch_size 128, enable_padding False) list the same sizes as 1.0.
TRTLLM_VERSIONS = ("1.0", "main-0004396")
# Limits past any server cgtool plans for, checked before a size list is built: the lists
# grow with the limit (SGLang's by 32 above 512), so --max-bs 1e10 would never finish.
MAX_BATCH_SIZE = 65536
MAX_NUM_TOKENS = 1 << 20
MAX_TP_SIZE = 1024


def known_versions(engine: str) -> tuple[str, ...]:
    _check_engine(engine)
    if engine == "sglang":
        return tuple(SGLANG_RELEASES)
    return VLLM_VERSIONS if engine == "vllm" else TRTLLM_VERSIONS


def resolve_version(engine: str, version: str | None) -> str:
    """The release to target: `version` when cgtool knows it, else the newest known."""
    versions = known_versions(engine)
    if version is None:
        return versions[-1]
    if version in versions:
        return version
    raise CgtoolError(
        f"cgtool has no {engine} release '{version}' (--engine-version)",
        f"Use one of: {', '.join(versions)}.",
    )


def sglang_release(version: str | None = None) -> SglangRelease:
    return SGLANG_RELEASES[resolve_version("sglang", version)]


def sglang_gpu_defaults(
    version: str | None, gpu_memory_bytes: int | None, tp_size: int = 1
) -> tuple[int, int]:
    """(chunked_prefill_size, decode max_bs) SGLang picks from the GPU's memory."""
    release = sglang_release(version)
    if gpu_memory_bytes is None:
        return 4096, 160  # SGLang's fallback when it cannot read the GPU
    gpu_mib = gpu_memory_bytes / MIB
    for bound_mib, chunk, small_tp_bs, large_tp_bs in release.tiers:
        if gpu_mib < bound_mib:
            return chunk, small_tp_bs if tp_size < 4 else large_tp_bs
    raise AssertionError("the last tier has no bound")


def vllm_large_gpu(gpu_memory_bytes: int | None, gpu_name: str | None = None) -> bool:
    """vLLM 0.33's larger batch defaults (8192 tokens, 1024 seqs for `vllm serve`) apply to
    GPUs of 70 GiB or more, A100s excepted by name (engine/arg_utils.py)."""
    return (gpu_memory_bytes or 0) >= 70 * GIB and "a100" not in (gpu_name or "").lower()


def vllm_default_max_num_seqs(gpu_memory_bytes: int | None, gpu_name: str | None = None) -> int:
    """`vllm serve`'s max_num_seqs when none is given (vllm 0.33 get_batch_defaults)."""
    return 1024 if vllm_large_gpu(gpu_memory_bytes, gpu_name) else 256


def server_args_max_bs(
    version: str | None, gpu_memory_bytes: int | None, tp_size: int, max_running: int | None
) -> int:
    """--cuda-graph-max-bs as SGLang's own arguments hold it (what its memory reserve counts):
    clipped to --max-running-requests from 0.5.23 on, left whole before."""
    release = sglang_release(version)
    max_bs = sglang_gpu_defaults(version, gpu_memory_bytes, tp_size)[1]
    if release.caps_max_bs_at_running and max_running:
        max_bs = min(max_bs, max_running)
    return max_bs


def default_schedule(
    engine: str,
    version: str | None = None,
    *,
    max_bs: int | None = None,
    max_tokens: int | None = None,
    gpu_memory_bytes: int | None = None,
    tp_size: int = 1,
    chunked_prefill_size: int | None = None,
    max_running_requests: int | None = None,
    gpu_name: str | None = None,
) -> EngineSchedule:
    """The capture lists `engine` (release `version`) builds for these limits by itself."""
    version = resolve_version(engine, version)
    check_limits(max_bs=max_bs, max_tokens=max_tokens, tp_size=tp_size)
    if engine == "sglang":
        return _sglang_schedule(
            version,
            max_bs,
            max_tokens,
            gpu_memory_bytes,
            tp_size,
            chunked_prefill_size,
            max_running_requests,
        )
    if engine == "vllm":
        return _vllm_schedule(
            version, max_bs, max_tokens, gpu_memory_bytes, max_running_requests, gpu_name
        )
    return _trtllm_schedule(version, max_bs, max_tokens)


def check_limits(
    *, max_bs: int | None = None, max_tokens: int | None = None, tp_size: int | None = None
) -> None:
    """Refuse a limit below 1 or past any server, in one sentence naming the flag."""
    for name, value, most in (("--max-bs", max_bs, MAX_BATCH_SIZE), ("--max-tokens", max_tokens, MAX_NUM_TOKENS),
                              ("--tp", tp_size, MAX_TP_SIZE)):
        if value is None:
            continue
        if value < 1:
            raise CgtoolError(f"{name} must be at least 1, got {value}", f"Pass {name} 1 or more.")
        if value > most:
            raise CgtoolError(f"{name} {value} is beyond any server cgtool plans for (at most {most})",
                              f"Pass {name} {most} or less.")


def trtllm_padded_batch_sizes(max_bs: int, version: str | None = None) -> list[int]:
    """TensorRT-LLM's generated list with enable_padding: [1, 2, 4] + 8..128 by 8, then (main
    after PR 12895) +64 steps, or (1.0) powers of two; max_bs appended when off the list."""
    version = resolve_version("trtllm", version)
    sizes = [1, 2, 4] + list(range(8, 129, 8))
    if version == "1.0":
        sizes += [2**i for i in range(8, math.ceil(math.log2(max_bs)))] if max_bs > 1 else []
    else:
        while sizes[-1] + 64 <= max_bs:
            sizes.append(sizes[-1] + 64)
    sizes = sorted(s for s in sizes if s <= max_bs)
    if not sizes or sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sizes


def _sglang_schedule(
    version: str,
    max_bs: int | None,
    max_tokens: int | None,
    gpu_memory_bytes: int | None,
    tp_size: int,
    chunked_prefill_size: int | None,
    max_running_requests: int | None,
) -> EngineSchedule:
    release = SGLANG_RELEASES[version]
    default_chunk, default_bs = sglang_gpu_defaults(version, gpu_memory_bytes, tp_size)
    chunk = chunked_prefill_size or default_chunk
    if max_bs is None:
        max_bs = default_bs
        if release.caps_max_bs_at_running and max_running_requests:
            max_bs = min(max_bs, max_running_requests)
    if max_tokens is None:
        max_tokens = chunk if release.max_tokens_is_chunk else 4096
    decode = sglang_decode_bs(max_bs)
    if (
        max_running_requests
        and not release.caps_max_bs_at_running
        and max_bs > max_running_requests
    ):
        # Older releases cap at run time instead (cuda_graph_runner get_batch_sizes_to_capture):
        # sizes above the request pool are dropped and the pool's size appended.
        decode = [s for s in decode if s < max_running_requests] + [max_running_requests]
        max_bs = max_running_requests
    return EngineSchedule(
        "sglang",
        version,
        tuple(decode),
        tuple(release.tokens_rule(max_tokens)),
        max_bs,
        max_tokens,
        release.piecewise_on_by_default,
        chunk,
        release.source,
    )


def _vllm_schedule(
    version: str,
    max_bs: int | None,
    max_tokens: int | None,
    gpu_memory_bytes: int | None,
    max_running_requests: int | None,
    gpu_name: str | None = None,
) -> EngineSchedule:
    # vllm 0.33 get_batch_defaults (`vllm serve`) and VllmConfig._set_cudagraph_sizes: one
    # list of token counts serves decode and mixed batches alike.
    memory = gpu_memory_bytes or 0
    large = vllm_large_gpu(memory, gpu_name)
    batched_tokens = max_tokens or (16384 if memory >= 160 * GIB else 8192 if large else 2048)
    max_num_seqs = max_running_requests or vllm_default_max_num_seqs(memory, gpu_name)
    ceiling = 1024 if memory >= 160 * GIB else 512  # B200-class GPUs get 1024
    capture_max = min(max_bs or min(max_num_seqs * 2, ceiling), batched_tokens)
    sizes = [s for s in (1, 2, 4) if s <= capture_max]
    sizes += list(range(8, min(capture_max + 1, 256), 8)) + list(range(256, capture_max + 1, 16))
    if batched_tokens <= capture_max:
        sizes.append(batched_tokens)
    if max_bs is None and max_num_seqs <= capture_max:
        sizes.append(max_num_seqs)
    sizes = sorted(set(sizes))
    return EngineSchedule(
        "vllm",
        version,
        tuple(sizes),
        tuple(sizes),
        sizes[-1],
        sizes[-1],
        True,
        batched_tokens,
        "vllm 0.33 config/vllm.py _set_cudagraph_sizes, engine/arg_utils.py",
    )


def _trtllm_schedule(version: str, max_bs: int | None, max_tokens: int | None) -> EngineSchedule:
    # TensorRT-LLM llmapi CudaGraphConfig._generate_cuda_graph_batch_sizes with its defaults
    # (max_batch_size 128, enable_padding False): batches off the list run eagerly.
    max_bs = max_bs or 128
    sizes = list(range(1, 32)) + [32, 64, 128]
    if max_bs > 1:
        sizes += [2**i for i in range(8, math.ceil(math.log2(max_bs)))]
    sizes = sorted(s for s in sizes if s <= max_bs)
    if sizes[-1] != max_bs:
        sizes.append(max_bs)
    return EngineSchedule(
        "trtllm",
        version,
        tuple(sizes),
        (),
        max_bs,
        max_tokens or 8192,
        False,
        max_tokens or 8192,
        f"TensorRT-LLM {version} llmapi/llm_args.py CudaGraphConfig (enable_padding=False)",
        pads=False,
    )


def _check_engine(engine: str) -> None:
    if engine not in ENGINES:
        raise CgtoolError(
            f"unknown engine '{engine}' (--engine)", f"Use one of: {', '.join(ENGINES)}."
        )
