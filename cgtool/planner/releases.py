"""Each engine release's prefill graphs, ceilings and memory semantics, with the files they
were read from.

`schedules.py` reproduces the capture lists; this module says what else a plan must know to be
right for a release: which backend records its prefill graphs (SGLang 0.5.23 breakable CUDA
graphs, no torch.compile; 0.5.10 torch.compile pieces; vLLM FULL_AND_PIECEWISE), whether a
prefill ceiling below the chunk is worth having, how an off-grid ceiling is treated, and which
environment variable changes what the memory fraction means (the value a plan assumes is the
release's default, printed with the flags).

Sources (`Source`): the newest releases on PyPI were read from their wheels (sglang 0.5.23,
vllm 0.33.0, whose `_version.py` names commit 4ba787ec9); SGLang's wheel names no commit, so
its rows cite the release and the file's sha256 prefix. TensorRT-LLM's wheel was not read (the
repository is too large to fetch); its newest rule is the stored `main` file at a commit.
Older rows keep the sources they were written from.
"""

from __future__ import annotations

from dataclasses import dataclass

from cgtool.planner.schedules import resolve_version


@dataclass(frozen=True, slots=True)
class Source:
    repo: str
    path: str
    at: str  # a commit, or "v<release> wheel (sha256 <prefix>)" where the archive names none
    read: str  # what was read there

    def cite(self) -> str:
        return f"{self.repo} {self.path} @ {self.at}: {self.read}"


@dataclass(frozen=True, slots=True)
class EnvSetting:
    name: str
    assumed: str  # the release's default, which a plan assumes
    effect: str  # what the fraction means under it


@dataclass(frozen=True, slots=True)
class ReleaseRules:
    engine: str
    version: str
    prefill_backend: str  # "breakable", "torch.compile piecewise", "none"
    prefill_on_by_default: bool
    # A prefill ceiling below the per-step token budget leaves the eager prefill peak beside
    # the graph pool (SGLang's BCG write-up): capture through the budget, or not at all.
    capture_through_chunk: bool
    ceiling_rule: str  # how the engine treats a ceiling or size off its grid
    fraction: str  # what the memory flag counts
    env: tuple[EnvSetting, ...]
    sources: tuple[Source, ...]


_SG = "sgl-project/sglang"
_SG_0523 = "v0.5.23 wheel"
_VL = "vllm-project/vllm"
_VL_0330 = "4ba787ec9 (v0.33.0 wheel _version.py)"
_TRT = "NVIDIA/TensorRT-LLM"

_SGLANG_OLD_FRACTION = "(weights + KV pool) / GPU memory, set before capture"
_RULES: tuple[ReleaseRules, ...] = (
    ReleaseRules(
        "sglang", "0.5.3.dev", "torch.compile piecewise", False, False,
        "explicit lists are captured as given", _SGLANG_OLD_FRACTION, (),
        (Source(_SG, "python/sglang/srt/server_args.py", "seed 000", "--enable-piecewise-cuda-graph opt-in"),),
    ),
    ReleaseRules(
        "sglang", "0.5.4", "torch.compile piecewise", False, False,
        "explicit lists are captured as given", _SGLANG_OLD_FRACTION, (),
        (Source(_SG, "python/sglang/srt/server_args.py", "v0.5.4 wheel", "--enable-piecewise-cuda-graph opt-in"),),
    ),
    ReleaseRules(
        "sglang", "0.5.10", "torch.compile piecewise", True, False,
        "explicit lists are captured as given", _SGLANG_OLD_FRACTION, (),
        (Source(_SG, "python/sglang/srt/server_args.py", "v0.5.10 wheel",
                "piecewise graphs on by default (--disable-piecewise-cuda-graph)"),),
    ),
    ReleaseRules(
        "sglang", "0.5.23", "breakable", True, True,
        "the default prefill list stops at the last grid size at or below its max (no max appended); "
        "decode sizes above the request pool are dropped and the pool's size appended",
        "(weights + KV pool) / GPU memory; the default reserves 8 MB per prefill size",
        (EnvSetting("SGLANG_ENABLE_POST_CAPTURE_KV_SIZING", "0",
                    "unset (off): the fraction is fixed before capture; set, SGLang sizes the KV pool "
                    "from free memory after capture and reserves only 1.5 GiB + tp/8 GiB"),),
        (
            Source(_SG, "python/sglang/srt/model_executor/cuda_graph_config.py", f"{_SG_0523} (sha256 0f6774dd)",
                   "default_prefill_backend: breakable on CUDA; backends full/breakable/disabled, tc_piecewise removed"),
            Source(_SG, "python/sglang/srt/arg_groups/cuda_graph_hook.py", f"{_SG_0523} (sha256 01f995a3)",
                   "generate_prefill_cuda_graph_batch_sizes; per-phase --cuda-graph-{bs,max-bs,backend}-{decode,prefill}"),
            Source(_SG, "python/sglang/srt/arg_groups/memory_hook.py", f"{_SG_0523} (sha256 0236a5e0)",
                   "prefill max_bs = chunked_prefill_size (MLA: min(8192, chunk)); reserve_for_graph_mb; "
                   "post-capture reserve 1536 MB + tp*pp/8 GiB"),
            Source(_SG, "python/sglang/srt/environ.py", f"{_SG_0523} (sha256 967ede87)",
                   "SGLANG_ENABLE_POST_CAPTURE_KV_SIZING = EnvBool(False)"),
        ),
    ),
    ReleaseRules(
        "vllm", "0.33", "torch.compile piecewise", True, False,
        "sizes above --max-num-batched-tokens are dropped; a --max-cudagraph-capture-size off the "
        "grid is truncated to the grid (and refused beside a list whose max differs)",
        "--kv-cache-memory-bytes, when given, sizes the KV cache and skips memory profiling; "
        "else --gpu-memory-utilization of total memory",
        (EnvSetting("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "1",
                    "on: without --kv-cache-memory-bytes, vLLM subtracts its own graph estimate from "
                    "the utilisation's budget; cgtool's --kv-cache-memory-bytes skips that profiling"),),
        (
            Source(_VL, "vllm/config/vllm.py", _VL_0330,
                   "_set_cudagraph_sizes: min(max_num_seqs * 2, 512; 1024 on SM100) capped at "
                   "max_num_batched_tokens; O2/O3 cudagraph_mode FULL_AND_PIECEWISE; truncation warning"),
            Source(_VL, "vllm/envs.py", _VL_0330, "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS default \"1\""),
            Source(_VL, "vllm/config/cache.py", _VL_0330, "gpu_memory_utilization default 0.92"),
            Source(_VL, "vllm/v1/worker/gpu_worker.py", _VL_0330,
                   "determine_available_memory: kv_cache_memory_bytes skips profiling"),
        ),
    ),
    ReleaseRules(
        "trtllm", "1.0", "none", False, False,
        "batch_sizes are captured as given; max_batch_size is appended to a generated list",
        "free_gpu_memory_fraction of memory free after weights and a warm-up", (),
        (Source(_TRT, "tensorrt_llm/llmapi/llm_args.py", "v1.0", "CudaGraphConfig._generate_cuda_graph_batch_sizes"),),
    ),
    ReleaseRules(
        "trtllm", "main-0004396", "none", False, False,
        "batch_sizes are captured as given; with enable_padding a generated list steps by 64 above "
        "128 and appends max_batch_size",
        "free_gpu_memory_fraction of memory free after weights and a warm-up", (),
        (Source(_TRT, "tensorrt_llm/llmapi/llm_args.py", "0004396720054fd8e205cbf616f21f0b57c6b412",
                "BaseCudaGraphConfig._generate_cuda_graph_batch_sizes: padding ladder [1,2,4]+8..128/8 then +64 "
                "(PR 12895); default max_batch_size 128"),),
    ),
)
RELEASE_RULES: dict[tuple[str, str], ReleaseRules] = {(r.engine, r.version): r for r in _RULES}


def release_rules(engine: str, version: str | None = None) -> ReleaseRules:
    return RELEASE_RULES[(engine, resolve_version(engine, version))]


def through_chunk(rules: ReleaseRules, tokens: tuple[int, ...], chunk: int) -> tuple[tuple[int, ...], str | None]:
    """Prefill sizes for the flags under the release's ceiling rule, and the note saying so."""
    if not rules.capture_through_chunk or not tokens or max(tokens) >= chunk:
        return tokens, None
    note = (f"prefill graphs captured through --chunked-prefill-size {chunk} (plan's ceiling {max(tokens)}): "
            f"with {rules.prefill_backend} graphs a lower ceiling keeps the eager prefill peak beside "
            "the graph pool")
    return (*tokens, chunk), note


def env_lines(rules: ReleaseRules) -> list[str]:
    """Comment lines for the flags: each setting the plan assumed, and what it means."""
    return [f"# assumes {e.name}={e.assumed} ({rules.engine} {rules.version} default): {e.effect}"
            for e in rules.env]


def off_grid_ceilings(
    engine: str, version: str | None, decode_bs: tuple[int, ...], tokens: tuple[int, ...],
    chunked_prefill_size: int, max_running_requests: int,
) -> list[str]:
    """Sizes of a plan (an old one given to --compare-plan) the release would not capture as
    written: each a sentence naming the size, what the engine does and where it says so."""
    rules = release_rules(engine, version)
    notes = []
    if engine == "vllm":
        dropped = sorted(s for s in set(decode_bs) | set(tokens) if s > chunked_prefill_size)
        if dropped:
            notes.append(f"vLLM {rules.version} drops capture sizes above --max-num-batched-tokens "
                         f"{chunked_prefill_size} ({', '.join(map(str, dropped))}) and, with "
                         "--max-cudagraph-capture-size given, refuses to start (config/vllm.py)")
        return notes
    if engine == "sglang" and decode_bs and max(decode_bs) > max_running_requests:
        above = [s for s in decode_bs if s > max_running_requests]
        notes.append(f"SGLang drops decode sizes above --max-running-requests {max_running_requests} "
                     f"({', '.join(map(str, above))}) and captures {max_running_requests} instead")
    if engine == "sglang" and tokens and max(tokens) > chunked_prefill_size:
        notes.append(f"prefill size {max(tokens)} is above --chunked-prefill-size {chunked_prefill_size}: "
                     "no prefill step reaches it, so its graph is memory for nothing")
    if engine == "sglang" and tokens and rules.capture_through_chunk and max(tokens) < chunked_prefill_size:
        notes.append(f"prefill ceiling {max(tokens)} is below --chunked-prefill-size {chunked_prefill_size}: "
                     f"SGLang {rules.version}'s {rules.prefill_backend} graphs then keep the eager peak too")
    return notes


def prefill_notes(
    engine: str, version: str | None, tokens: tuple[int, ...], profile_backend: str | None = None,
) -> list[str]:
    """A --profile measured with another prefill backend than the release's. (The planner
    itself captures through the chunk where the release needs it: choose_and_size.)
    `profile_backend` is a capture report's settings.prefill_backend ("piecewise" or
    "breakable"), None without a capture report."""
    rules = release_rules(engine, version)
    name = {"sglang": "SGLang", "vllm": "vLLM", "trtllm": "TensorRT-LLM"}[engine]
    notes = []
    measured = {"piecewise": "torch.compile piecewise", "breakable": "breakable"}.get(profile_backend or "")
    if tokens and measured and rules.prefill_backend != "none" and measured != rules.prefill_backend:
        option = "breakable" if rules.prefill_backend == "breakable" else "piecewise"
        notes.append(
            f"the --profile report measured {measured} prefill graphs; {name} {rules.version} records "
            f"{rules.prefill_backend} ones (`cgtool capture --prefill-backend {option}` measures those)"
        )
    return notes
