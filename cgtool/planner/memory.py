"""How much memory the KV pool can have: cgtool's recommendation and the engines' defaults.

SGLang's `--mem-fraction-static` and vLLM's `--gpu-memory-utilization` are fractions of the
GPU's total memory (weights included); TensorRT-LLM's `free_gpu_memory_fraction` is a fraction
of what is free after the weights and a warm-up. cgtool sizes the parts left outside the
static pool — prefill activations, graphs, a stated margin — and derives each engine's figure
from the same KV budget.
"""

from __future__ import annotations

import math

from cgtool.documents.plan_document import PlanMemory
from cgtool.errors import CgtoolError
from cgtool.planner.margin import named_margin
from cgtool.planner.memory_terms import activation_bytes_per_token, decode_partials_bytes
from cgtool.planner.parallel import kv_heads_per_rank, rank_shapes
from cgtool.planner.schedules import sglang_release
from cgtool.specs.config import ModelConfig
from cgtool.units import BF16_BYTES, GIB, MIB

VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.92  # vllm 0.33 CacheConfig default
TRTLLM_DEFAULT_FREE_FRACTION = 0.9  # TensorRT-LLM KvCacheConfig default


def margin_bytes(
    cfg: ModelConfig, max_running_requests: int, tp_size: int = 1, chunked_prefill_size: int = 8192
) -> int:
    """The margin kept free beyond activations and graphs: the sum of its named parts."""
    return sum(margin_parts(cfg, max_running_requests, tp_size, chunked_prefill_size).values())


def margin_parts(
    cfg: ModelConfig, max_running_requests: int, tp_size: int = 1, chunked_prefill_size: int = 8192
) -> dict[str, int]:
    """Each part of the margin by name (cgtool.planner.margin gives each its figure and source)."""
    extend = chunked_prefill_size * activation_bytes_per_token(cfg, tp_size)
    return named_margin(cfg, max_running_requests, extend, tp_size)


def activation_bytes(
    cfg: ModelConfig, chunked_prefill_size: int, max_running_requests: int, tp_size: int = 1
) -> int:
    """Peak of an eager forward on one rank: a full prefill chunk, or a decode of every
    running request with the decode kernel's split partials (2.0 GiB of deepseek-v2-lite's
    3,975 requests: 16 heads x 16 splits x 513 fp32 a request); the logits and the sampler
    are a part of the margin."""
    per_token = activation_bytes_per_token(cfg, tp_size)
    bs = max_running_requests
    decode = bs * (per_token + decode_partials_bytes(cfg, bs, tp_size))
    return int(max(chunked_prefill_size * per_token, decode))


def sglang_default_mem_fraction(
    version: str | None,
    gpu_memory_bytes: int,
    *,
    chunked_prefill_size: int,
    max_bs: int,
    num_piecewise_tokens: int,
    tp_size: int = 1,
) -> float:
    """SGLang's own heuristic (its _handle_gpu_memory_settings): MB reserved for activations
    and graphs, with a 10 GB floor on GPUs above 60 GB."""
    release = sglang_release(version)
    gpu_mib = gpu_memory_bytes / MIB
    reserved_mib = 512 + max(chunked_prefill_size, 2048) * 1.5 + max_bs * 2 + tp_size / 8 * 1024
    if release.counts_piecewise_reserve:
        reserved_mib += num_piecewise_tokens * 8
    if gpu_mib > 60 * 1024:
        reserved_mib = max(reserved_mib, 10 * 1024)
    return round((gpu_mib - reserved_mib) / gpu_mib, 3)


def kv_tokens_at(
    cfg: ModelConfig, gpu_memory_bytes: int, mem_fraction_static: float, tp_size: int = 1
) -> int:
    """KV tokens SGLang's pool gets: the static share of one rank's memory minus its weights,
    over its share of a token's KV."""
    shard = rank_shapes(cfg, tp_size)
    kv_bytes = mem_fraction_static * gpu_memory_bytes - shard.weight_bytes(BF16_BYTES)
    return max(0, int(kv_bytes // shard.kv_bytes_per_token(BF16_BYTES)))


def vllm_default_pool(
    cfg: ModelConfig,
    gpu_memory_bytes: int,
    *,
    chunked_prefill_size: int,
    max_num_seqs: int,
    tp_size: int = 1,
) -> tuple[int, float]:
    """(KV tokens, static fraction) of vLLM at its default utilisation, which like SGLang's
    fraction is of each GPU's memory; the fraction counts weights and pool, as SGLang's does."""
    shard = rank_shapes(cfg, tp_size)
    weights = shard.weight_bytes(BF16_BYTES)
    outside = activation_bytes(cfg, chunked_prefill_size, max_num_seqs, tp_size)
    kv_bytes = VLLM_DEFAULT_GPU_MEMORY_UTILIZATION * gpu_memory_bytes - weights - outside
    kv_tokens = max(0, int(kv_bytes // shard.kv_bytes_per_token(BF16_BYTES)))
    return kv_tokens, round((weights + max(kv_bytes, 0)) / gpu_memory_bytes, 3)


def plan_memory(
    cfg: ModelConfig,
    gpu_memory_bytes: int,
    *,
    graph_bytes: int,
    chunked_prefill_size: int,
    max_running_requests: int,
    peak_kv_demand_tokens: int,
    typical_request_tokens: int,
    default_mem_fraction_static: float,
    tp_size: int = 1,
) -> PlanMemory:
    """Recommend the static fraction that leaves activations, graphs and the margin free, on
    each GPU of `tp_size` (graph_bytes is one rank's)."""
    shard = rank_shapes(cfg, tp_size)
    weights = shard.weight_bytes(BF16_BYTES)
    activations = activation_bytes(cfg, chunked_prefill_size, max_running_requests, tp_size)
    parts = margin_parts(cfg, max_running_requests, tp_size, chunked_prefill_size)
    margin = sum(parts.values())
    outside = activations + graph_bytes + margin
    # Rounded down to SGLang's 3 decimals, so the margin is never eaten by rounding.
    fraction = math.floor((gpu_memory_bytes - outside) / gpu_memory_bytes * 1000) / 1000
    kv_tokens = kv_tokens_at(cfg, gpu_memory_bytes, fraction, tp_size)
    if kv_tokens <= 0:
        per_gpu = f" per GPU at --tp {tp_size}" if tp_size > 1 else ""
        raise CgtoolError(
            f"{cfg.name} does not fit: weights {weights / GIB:.1f} GiB plus activations, graphs and the "
            f"{margin / GIB:.1f} GiB margin leave no KV cache on {gpu_memory_bytes / GIB:.1f} GiB{per_gpu}",
            # cgtool does not shard MoE or MLA models (--tp refuses them): no TP to suggest.
            "Use a GPU with more memory, "
            + ("" if cfg.moe or cfg.mla else "tensor parallelism (--tp), ")
            + "a smaller --chunked-prefill-size or --max-running-requests.",
        )
    kv_bytes = kv_tokens * shard.kv_bytes_per_token(BF16_BYTES)
    free_after_load = gpu_memory_bytes - weights - activations - graph_bytes
    reachable = min(max_running_requests, kv_tokens // max(typical_request_tokens, 1))
    plan = PlanMemory(
        gpu_memory_bytes=gpu_memory_bytes,
        weights_bytes=weights,
        graph_bytes=graph_bytes,
        activation_bytes=activations,
        margin_bytes=margin,
        kv_bytes=kv_bytes,
        kv_tokens=kv_tokens,
        mem_fraction_static=fraction,
        gpu_memory_utilization=round(
            (weights + kv_bytes + activations + graph_bytes) / gpu_memory_bytes, 3
        ),
        trtllm_free_gpu_memory_fraction=math.floor(kv_bytes / free_after_load * 1000) / 1000,
        default_mem_fraction_static=default_mem_fraction_static,
        default_kv_tokens=kv_tokens_at(
            cfg, gpu_memory_bytes, default_mem_fraction_static, tp_size
        ),
        peak_kv_demand_tokens=peak_kv_demand_tokens,
        reachable_batch=int(reachable),
        tp_size=tp_size,
        kv_heads_per_rank=kv_heads_per_rank(cfg, tp_size),
        warnings=[],
        margin_parts=parts,
    )
    plan.warnings.extend(_pool_warnings(plan, typical_request_tokens, max_running_requests))
    return plan


def _pool_warnings(
    plan: PlanMemory, typical_request_tokens: int, max_running_requests: int
) -> list[str]:
    notes = []
    if plan.peak_kv_demand_tokens > plan.kv_tokens:
        notes.append(
            f"the trace reserved up to {plan.peak_kv_demand_tokens} KV tokens at once, more than the "
            f"{plan.kv_tokens} this plan leaves: requests will queue for memory"
        )
    if plan.reachable_batch < max_running_requests:
        notes.append(
            f"the KV pool holds about {plan.reachable_batch} requests of the trace's typical "
            f"{typical_request_tokens} tokens, fewer than --max-running-requests {max_running_requests}"
        )
    return notes


def sglang_default_max_running(kv_tokens: int, context_len: int) -> int:
    # SGLang's _resolve_max_num_reqs without --max-running-requests.
    estimated = max(min(int(kv_tokens / context_len * 512), 4096), 2048)
    return max(1, min(estimated, kv_tokens // 2))


def check_plan_safety(
    tokens: list[int], chunked_prefill_size: int, context_len: int, memory: PlanMemory
) -> None:
    """Refuse plans that would break a server: token bins it can never use or that exceed what
    it allows, and a static fraction that leaves less than the stated margin free."""
    ceiling = min(chunked_prefill_size, context_len)
    over = [t for t in tokens if t > ceiling]
    if over:
        limit = "chunked prefill size" if ceiling == chunked_prefill_size else "context length"
        raise CgtoolError(
            f"token bins {over} exceed the {limit} ({ceiling}): an extend step never has that many tokens",
            "Drop them, or raise --chunked-prefill-size (within the model's context)."
            if ceiling == chunked_prefill_size else
            f"Drop them, or lower --chunked-prefill-size to {context_len} or less.",
        )
    free = (1 - memory.mem_fraction_static) * memory.gpu_memory_bytes
    needed = memory.activation_bytes + memory.graph_bytes + memory.margin_bytes
    if free < needed:
        raise CgtoolError(
            f"--mem-fraction-static {memory.mem_fraction_static:.3f} leaves {free / GIB:.2f} GiB free, less than "
            f"activations, graphs and the {memory.margin_bytes / GIB:.1f} GiB margin ({needed / GIB:.2f} GiB)",
            "Capture fewer or smaller graphs (--budget-memory) or use a smaller --chunked-prefill-size.",
        )
