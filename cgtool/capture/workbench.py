"""A model on the GPU with its KV pool sized as SGLang sizes it, and requests to measure with."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from cgtool.attention import make_backend
from cgtool.errors import EnvironmentProblem
from cgtool.model.loader import build_model
from cgtool.model.moe import use_moe_backend
from cgtool.model.parallel import kv_head_range, local_config
from cgtool.runtime.batch import ForwardBatch
from cgtool.runtime.distributed import SINGLE, TensorParallel, all_min
from cgtool.runtime.engine import ModelRunner, decode_batch, extend_batch
from cgtool.runtime.kv import KVPool, free_after_weights, kv_budget_bytes, kv_tokens_for_budget
from cgtool.specs.config import ModelConfig


@dataclass
class Workbench:
    cfg: ModelConfig  # this rank's share of the heads and MLP (the whole model at TP=1)
    runner: ModelRunner
    weights_bytes: int
    kv_tokens: int
    decode_rows: list[int]  # requests holding `context_len` tokens each, for decode batches
    extend_row: int  # one request with room for the largest piecewise size
    context_len: int
    seed: int

    def decode_batch(self, bs: int) -> ForwardBatch:
        gen = torch.Generator().manual_seed(self.seed + bs)
        ids = torch.randint(0, self.cfg.vocab_size, (bs,), generator=gen).tolist()
        rows = self.decode_rows[:bs]
        return decode_batch(self.runner.kv_pool, rows, [self.context_len] * bs, ids)

    def extend_batch(self, num_tokens: int) -> ForwardBatch:
        """One request prefilling `num_tokens` new tokens, as SGLang's prefill latency test does."""
        gen = torch.Generator().manual_seed(self.seed + num_tokens)
        ids = torch.randint(0, self.cfg.vocab_size, (num_tokens,), generator=gen).tolist()
        return extend_batch(self.runner.kv_pool, [self.extend_row], [0], [ids])


def build_workbench(
    cfg: ModelConfig,
    *,
    weights_dir: Path | None,
    dtype: torch.dtype,
    mem_fraction_static: float,
    max_bs: int,
    max_tokens: int,
    context_len: int,
    seed: int,
    kv_tokens: int | None = None,
    tp: TensorParallel = SINGLE,
    moe_backend: str = "triton",
) -> Workbench:
    """`kv_tokens` fixes the pool size; by default it follows `mem_fraction_static` as SGLang's does.

    With tensor parallelism this builds one rank's share: its weights, its KV heads, and a KV
    pool of as many tokens as the rank with the least free memory can hold.
    """
    max_context = max(context_len + 1, max_tokens)
    if max_context > cfg.max_context_len:
        raise EnvironmentProblem(
            f"{max_context} tokens exceed {cfg.name}'s context length {cfg.max_context_len}",
            "Lower --max-tokens / --context-len.",
        )
    model = build_model(
        cfg, device="cuda", dtype=dtype, max_positions=max_context, weights_dir=weights_dir, seed=seed,
        tp=tp,
    )
    use_moe_backend(model, moe_backend)
    weights_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    local = local_config(cfg, tp)
    free, total = free_after_weights()  # each rank's too: the whole tensors it sliced its weights from
    if tp.size > 1:
        free = all_min(free)  # every rank holds the same slots: the GPU with least room decides
    source = f"--max-total-tokens {kv_tokens}" if kv_tokens else f"--mem-fraction-static {mem_fraction_static}"
    if kv_tokens is None:
        kv_tokens = kv_tokens_for_budget(local, kv_budget_bytes(total, free, mem_fraction_static), dtype)
    needed = max_bs * (context_len + 1) + max_tokens + 2
    if kv_tokens < needed:
        raise EnvironmentProblem(
            f"{source} leaves room for {kv_tokens} KV tokens, "
            f"but measuring {max_bs} requests of {context_len} tokens needs {needed}",
            f"Raise {source.split()[0]}, or lower --max-bs / --context-len.",
        )
    pool = KVPool(local, kv_tokens, max_bs + 2, max_context, dtype, "cuda")
    decode_rows = [pool.alloc_request(context_len + 1)[0] for _ in range(max_bs)]
    extend_row = pool.alloc_request(max_tokens)[0]
    _fill_cache_randomly(pool, used_slots=needed, seed=seed, heads=kv_head_range(cfg, tp), cfg=cfg)
    runner = ModelRunner(model, pool, make_backend("triton", local.num_heads, local.head_dim))
    return Workbench(local, runner, weights_bytes, kv_tokens, decode_rows, extend_row, context_len, seed)


def _fill_cache_randomly(
    pool: KVPool, used_slots: int, seed: int, heads: tuple[int, int], cfg: ModelConfig
) -> None:
    # Decode reads every cached token: random K/V stand in for a real prefill of the context.
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for buf in pool.k_buffers + pool.v_buffers:
        if heads == (0, cfg.num_kv_heads):
            buf[1:used_slots].normal_(generator=gen)
            continue
        # This rank's heads of the cache TP=1 would hold: the same numbers at any TP size.
        shape = (used_slots - 1, cfg.num_kv_heads, cfg.head_dim)
        full = torch.empty(shape, dtype=buf.dtype, device=buf.device).normal_(generator=gen)
        buf[1:used_slots] = full[:, heads[0] : heads[1]]
