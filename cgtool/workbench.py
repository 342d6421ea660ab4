"""A model on the GPU with its KV pool sized as SGLang sizes it, and requests to measure with."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from cgtool.attention import make_backend
from cgtool.batch import ForwardBatch
from cgtool.config import ModelConfig
from cgtool.engine import ModelRunner, decode_batch, extend_batch
from cgtool.errors import EnvironmentProblem
from cgtool.kv import KVPool, kv_budget_bytes, kv_tokens_for_budget
from cgtool.model.loader import build_model


@dataclass
class Workbench:
    cfg: ModelConfig
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
) -> Workbench:
    """`kv_tokens` fixes the pool size; by default it follows `mem_fraction_static` as SGLang's does."""
    max_context = max(context_len + 1, max_tokens)
    if max_context > cfg.max_context_len:
        raise EnvironmentProblem(
            f"{max_context} tokens exceed {cfg.name}'s context length {cfg.max_context_len}",
            "Lower --max-tokens / --context-len.",
        )
    model = build_model(
        cfg, device="cuda", dtype=dtype, max_positions=max_context, weights_dir=weights_dir, seed=seed
    )
    weights_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    source = f"--max-total-tokens {kv_tokens}" if kv_tokens else f"--mem-fraction-static {mem_fraction_static}"
    if kv_tokens is None:
        kv_tokens = kv_tokens_for_budget(cfg, kv_budget_bytes(total, free, mem_fraction_static), dtype)
    needed = max_bs * (context_len + 1) + max_tokens + 2
    if kv_tokens < needed:
        raise EnvironmentProblem(
            f"{source} leaves room for {kv_tokens} KV tokens, "
            f"but measuring {max_bs} requests of {context_len} tokens needs {needed}",
            f"Raise {source.split()[0]}, or lower --max-bs / --context-len.",
        )
    pool = KVPool(cfg, kv_tokens, max_bs + 2, max_context, dtype, "cuda")
    decode_rows = [pool.alloc_request(context_len + 1)[0] for _ in range(max_bs)]
    extend_row = pool.alloc_request(max_tokens)[0]
    _fill_cache_randomly(pool, used_slots=needed, seed=seed)
    runner = ModelRunner(model, pool, make_backend("triton", cfg.num_heads, cfg.head_dim))
    return Workbench(cfg, runner, weights_bytes, kv_tokens, decode_rows, extend_row, context_len, seed)


def _fill_cache_randomly(pool: KVPool, used_slots: int, seed: int) -> None:
    # Decode reads every cached token: random K/V stand in for a real prefill of the context.
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for buf in pool.k_buffers + pool.v_buffers:
        buf[1:used_slots].normal_(generator=gen)
