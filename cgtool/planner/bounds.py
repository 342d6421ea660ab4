"""The largest server limits one GPU can hold, checked before anything is sized from them.

The planner builds tables indexed by batch size and token count up to --max-running-requests
and --chunked-prefill-size; a typo of a few extra digits once asked numpy for 74.5 GiB. A
limit past what the GPU could hold even with nothing else on it is refused in one line.
"""

from __future__ import annotations

from cgtool.errors import InputError
from cgtool.planner.memory import margin_bytes
from cgtool.planner.memory_terms import activation_bytes_per_token, decode_partials_bytes
from cgtool.planner.parallel import rank_shapes
from cgtool.specs.config import ModelConfig
from cgtool.specs.gpus import GpuSpec
from cgtool.units import BF16_BYTES, GIB

REQ_TO_TOKEN_BYTES = 4  # SGLang's req_to_token table is int32, one row per request slot
VLLM_BLOCK_TOKENS = 16  # vLLM's default KV block: a running sequence holds at least one
MANY_REQUESTS = 1 << 20  # past it, the decode kernel's splits per request are at their floor


def _room(cfg: ModelConfig, gpu: GpuSpec, tp_size: int) -> int:
    """One rank's memory less its weights and the margin's parts that no limit scales."""
    weights = rank_shapes(cfg, tp_size).weight_bytes(BF16_BYTES)
    return gpu.memory_bytes - weights - margin_bytes(cfg, 0, tp_size, chunked_prefill_size=0)


def max_running_bound(cfg: ModelConfig, gpu: GpuSpec, engine: str, tp_size: int = 1) -> int:
    """Running requests one rank could hold with nothing else in its room, each at least: its
    eager decode activations and the decode kernel's partials, the sampler's fp32 logits
    (the margin's share of a request), and a KV token plus, for SGLang, a req_to_token row of
    the context length, for vLLM a KV block (the plan's own memory model, per request)."""
    shard = rank_shapes(cfg, tp_size)
    kv_token = shard.kv_bytes_per_token(BF16_BYTES)
    per_request = (
        activation_bytes_per_token(cfg, tp_size)
        + decode_partials_bytes(cfg, MANY_REQUESTS, tp_size)
        + margin_bytes(cfg, 1, tp_size, chunked_prefill_size=0)
        - margin_bytes(cfg, 0, tp_size, chunked_prefill_size=0)
    )
    if engine == "vllm":
        per_request += VLLM_BLOCK_TOKENS * kv_token
    else:
        per_request += REQ_TO_TOKEN_BYTES * cfg.max_context_len + kv_token
    return max(0, _room(cfg, gpu, tp_size) // per_request)


def chunk_bound(cfg: ModelConfig, gpu: GpuSpec, tp_size: int = 1) -> int:
    """Tokens one extend step could hold with nothing else in the room: each one's KV slot,
    eager activations and the allocator's fragmentation over them (the plan's own model)."""
    shard = rank_shapes(cfg, tp_size)
    fragmentation = margin_bytes(cfg, 0, tp_size, chunked_prefill_size=1) - margin_bytes(
        cfg, 0, tp_size, chunked_prefill_size=0
    )
    per_token = (
        shard.kv_bytes_per_token(BF16_BYTES) + activation_bytes_per_token(cfg, tp_size) + fragmentation
    )
    return max(0, _room(cfg, gpu, tp_size) // per_token)


def check_server_limits(
    cfg: ModelConfig,
    gpu: GpuSpec,
    engine: str,
    tp_size: int,
    max_running: int | None,
    chunk: int | None,
) -> None:
    """InputError naming the flag when a limit is past what one rank could ever hold."""
    room = _room(cfg, gpu, tp_size)
    if room <= 0:
        return  # the plan's own "does not fit" says so, naming the weights
    where = f"{gpu.name}'s {room / GIB:.1f} GiB beside {cfg.name}'s weights and the margin"
    if max_running is not None:
        bound = max_running_bound(cfg, gpu, engine, tp_size)
        if max_running > bound:
            holds = "a KV block" if engine == "vllm" else (
                f"a req_to_token row ({cfg.max_context_len:,} int32), a KV token")
            raise InputError(
                f"--max-running-requests {max_running} is more than one GPU can run: each request "
                f"holds {holds}, its decode activations and its sampler logits, and {where} "
                f"hold at most {bound:,}",
                f"Pass --max-running-requests {bound} or less, or leave it out for the engine's.",
            )
    if chunk is not None:
        bound = chunk_bound(cfg, gpu, tp_size)
        if chunk > bound:
            raise InputError(
                f"--chunked-prefill-size {chunk} is more than one GPU can run in a step: each "
                f"token holds a KV slot and its activations, and {where} hold at most {bound:,}",
                f"Pass --chunked-prefill-size {bound} or less, or leave it out for the engine's.",
            )
