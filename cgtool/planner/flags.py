"""Server flag lines for a plan, spelled as each engine release's argument parser wants them.

SGLang renamed its graph flags: up to 0.5.10 `--cuda-graph-bs` / `--piecewise-cuda-graph-tokens`,
from 0.5.23 per-phase `--cuda-graph-bs-decode` / `--cuda-graph-bs-prefill` (the old names are
rejected there). Every name emitted here is checked in the tests against the option names of
that release's own parser (tests/data/planner/). Lines that are not flags start with "#": a
release rule applied to the lists (cgtool.planner.releases) or an environment setting the plan
assumed, with what the memory flag means under it.
"""

from __future__ import annotations

from dataclasses import dataclass

from cgtool.planner.releases import env_lines, release_rules, through_chunk
from cgtool.planner.schedules import resolve_version, sglang_release


@dataclass(frozen=True, slots=True)
class FlagValues:
    decode_bs: tuple[int, ...]
    piecewise_tokens: tuple[int, ...]
    mem_fraction_static: float  # SGLang: (weights + KV) / total memory
    gpu_memory_utilization: float  # vLLM: everything it may allocate / total memory
    trtllm_free_fraction: float  # TensorRT-LLM: KV / memory free after loading and warm-up
    kv_tokens: int
    kv_bytes: int
    chunked_prefill_size: int
    max_running_requests: int
    tp_size: int = 1  # memory figures above are per GPU of tp_size


def _ints(values: tuple[int, ...]) -> str:
    return " ".join(str(v) for v in values)


# Each engine's spelling of the tensor-parallel size, named only above one GPU.
_TP_FLAG = {"sglang": "--tp-size", "vllm": "--tensor-parallel-size", "trtllm": "--tp_size"}
# The limits and memory a plan sets, as (flag, FlagValues field, format) in the order each
# engine's lines give them; fractions with the three decimals the plan rounds them to.
_LIMIT_FLAGS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "sglang": (
        ("--mem-fraction-static", "mem_fraction_static", ".3f"),
        ("--max-total-tokens", "kv_tokens", ""),
        ("--chunked-prefill-size", "chunked_prefill_size", ""),
        ("--max-running-requests", "max_running_requests", ""),
    ),
    "vllm": (
        ("--gpu-memory-utilization", "gpu_memory_utilization", ".3f"),
        ("--kv-cache-memory-bytes", "kv_bytes", ""),
        ("--max-num-batched-tokens", "chunked_prefill_size", ""),
        ("--max-num-seqs", "max_running_requests", ""),
    ),
    "trtllm": (
        ("--max_batch_size", "max_running_requests", ""),
        ("--max_num_tokens", "chunked_prefill_size", ""),
        ("--kv_cache_free_gpu_memory_fraction", "trtllm_free_fraction", ".3f"),
    ),
}


def _tp_lines(engine: str, values: FlagValues) -> list[str]:
    return [f"{_TP_FLAG[engine]} {values.tp_size}"] if values.tp_size > 1 else []


def _limit_lines(engine: str, values: FlagValues) -> list[str]:
    return [
        f"{flag} {format(getattr(values, field), spec)}"
        for flag, field, spec in _LIMIT_FLAGS[engine]
    ]


def within_running(decode_bs: tuple[int, ...], max_running: int) -> tuple[tuple[int, ...], list[str]]:
    """Decode sizes as SGLang captures them: sizes above the request pool dropped and the
    pool's size captured instead (model_executor/runner/base_cuda_graph_runner.py
    get_batch_sizes_to_capture, 0.5.23; cuda_graph_runner.py before), so the flags hold what runs."""
    if not decode_bs or max(decode_bs) <= max_running:
        return decode_bs, []
    kept = tuple(sorted({s for s in decode_bs if s <= max_running} | {max_running}))
    above = " ".join(str(s) for s in decode_bs if s > max_running)
    return kept, [(f"# decode sizes above --max-running-requests {max_running} ({above}) replaced by "
                   f"{max_running}, as the engine would")]


def sglang_flags(values: FlagValues, version: str | None = None) -> list[str]:
    release = sglang_release(version)
    rules = release_rules("sglang", release.version)
    decode, notes = within_running(values.decode_bs, values.max_running_requests)
    tokens, note = through_chunk(rules, values.piecewise_tokens, values.chunked_prefill_size)
    lines = _tp_lines("sglang", values)
    if release.per_phase_flags:
        if decode:
            lines += [
                f"--cuda-graph-max-bs-decode {max(decode)}",
                f"--cuda-graph-bs-decode {_ints(decode)}",
            ]
        else:
            lines.append("--disable-decode-cuda-graph")
        if tokens:
            lines += [
                # The backend the plan assumed, named rather than left to the platform's default.
                f"--cuda-graph-backend-prefill {rules.prefill_backend}",
                f"--cuda-graph-max-bs-prefill {max(tokens)}",
                f"--cuda-graph-bs-prefill {_ints(tokens)}",
            ]
        else:
            lines.append("--disable-prefill-cuda-graph")
    else:
        if decode:
            lines += [f"--cuda-graph-max-bs {max(decode)}", f"--cuda-graph-bs {_ints(decode)}"]
        else:
            lines.append("--disable-cuda-graph")
        if tokens:
            if not release.piecewise_on_by_default:
                lines.append("--enable-piecewise-cuda-graph")
            listed = f"'{list(tokens)}'" if release.tokens_flag_json else _ints(tokens)
            lines += [
                f"--piecewise-cuda-graph-max-tokens {max(tokens)}",
                f"--piecewise-cuda-graph-tokens {listed}",
            ]
        elif release.piecewise_on_by_default:
            lines.append("--disable-piecewise-cuda-graph")
    notes += [f"# {note}"] if note else []
    return lines + _limit_lines("sglang", values) + notes + env_lines(rules)


def vllm_flags(values: FlagValues, version: str | None = None) -> list[str]:
    rules = release_rules("vllm", version)
    # vLLM captures one list of token counts for decode and mixed batches alike; a decode
    # step of b requests is b tokens, so the union serves both kinds of step. Sizes above the
    # token budget would be dropped by vLLM, and with the max flag beside them it refuses to
    # start (config/vllm.py _set_cudagraph_sizes): never emitted.
    union = set(values.decode_bs) | set(values.piecewise_tokens)
    sizes = tuple(sorted(s for s in union if s <= values.chunked_prefill_size))
    dropped = sorted(union - set(sizes))
    lines = _tp_lines("vllm", values)
    lines += (
        [f"--cudagraph-capture-sizes {_ints(sizes)}", f"--max-cudagraph-capture-size {max(sizes)}"]
        if sizes
        else ["--enforce-eager"]  # without a list vLLM would capture its own default one
    )
    notes = [(f"# left out, above --max-num-batched-tokens {values.chunked_prefill_size}: "
              f"{_ints(tuple(dropped))}")] if dropped else []
    return lines + _limit_lines("vllm", values) + notes + env_lines(rules)


def trtllm_flags(values: FlagValues, version: str | None = None) -> list[str]:
    resolve_version("trtllm", version)
    # trtllm-serve takes graph sizes only through its LLM API options file.
    decode = list(values.decode_bs)
    options = (
        f"cuda_graph_config: {{enable_padding: true, batch_sizes: {decode}}}"
        if decode
        else "cuda_graph_config: null"  # null turns graphs off
    )
    return (
        _tp_lines("trtllm", values)
        + _limit_lines("trtllm", values)
        + ["--extra_llm_api_options cgtool-trtllm.yaml", f"# cgtool-trtllm.yaml: {options}"]
    )


def all_flags(values: FlagValues, sglang_version: str | None = None) -> dict[str, list[str]]:
    return {
        "sglang": sglang_flags(values, sglang_version),
        "vllm": vllm_flags(values),
        "trtllm": trtllm_flags(values),
    }


def flag_names(lines: list[str]) -> list[str]:
    """The option names in flag lines (comment lines skipped)."""
    return [line.split()[0] for line in lines if line.startswith("--")]
