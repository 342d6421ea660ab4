"""Tensor parallelism in a plan: what one rank holds, and what its collectives cost.

Sharded as SGLang (after Megatron-LM) shards Llama and Qwen: QKV and gate/up column-parallel,
O and down row-parallel, each followed by an all-reduce of the hidden states; embedding and LM
head split by vocabulary rows (the embedding's output all-reduced, the logits all-gathered);
norms replicated. With fewer KV heads than ranks, each rank keeps one KV head, copied from the
head its query heads use. Every figure here is per rank. The ranks are identical, so the
minimum across ranks that SGLang takes of its per-rank memory sizing is that same figure.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from cgtool.errors import CgtoolError
from cgtool.specs.config import ModelConfig
from cgtool.specs.gpus import GpuSpec
from cgtool.units import BF16_BYTES

# One node: the link figures in cgtool.specs.gpus describe NVLink or PCIe inside a server of up to
# 8 GPUs, not the network between servers.
MAX_TP_SIZE = 8
# NCCL's bus bandwidth at large messages is about 80% of the per-direction link peak
# (nccl-tests all_reduce_perf on 8x H100 SXM: ~360 of 450 GB/s without NVLS). An estimate.
_LINK_EFFICIENCY = 0.8


def kv_heads_per_rank(cfg: ModelConfig, tp_size: int) -> int:
    # SGLang's LlamaAttention: max(1, total_num_kv_heads // tp_size).
    return max(1, cfg.num_kv_heads // tp_size)


def rank_shapes(cfg: ModelConfig, tp_size: int) -> ModelConfig:
    """The shapes one rank holds, as a ModelConfig, so that its parameter and KV formulas
    apply unchanged: heads, MLP width and vocabulary rows divided; hidden size and norms whole.
    Logits are gathered to the full vocabulary on every rank: take them from `cfg`."""
    if tp_size == 1:
        return cfg
    return replace(
        cfg,
        num_heads=cfg.num_heads // tp_size,
        num_kv_heads=kv_heads_per_rank(cfg, tp_size),
        intermediate_size=cfg.intermediate_size // tp_size,
        vocab_size=-(-cfg.vocab_size // tp_size),  # the last rank's rows are padded to match
    )


def _tp_problem(cfg: ModelConfig, tp_size: int) -> str | None:
    """Why SGLang would refuse this split (its divide() asserts), or None."""
    kv = cfg.num_kv_heads
    if tp_size > 1 and (cfg.moe or cfg.mla):
        return f"would split {cfg.name}'s experts or latent attention, which cgtool does not shard yet"
    if cfg.num_heads % tp_size:
        return f"does not divide {cfg.name}'s {cfg.num_heads} attention heads"
    if (kv % tp_size) if kv >= tp_size else (tp_size % kv):
        return f"neither divides {cfg.name}'s {kv} KV heads nor is a multiple of them"
    if cfg.intermediate_size % tp_size:
        return f"does not divide {cfg.name}'s MLP width ({cfg.intermediate_size})"
    return None


def valid_tp_sizes(cfg: ModelConfig) -> list[int]:
    return [n for n in range(1, MAX_TP_SIZE + 1) if _tp_problem(cfg, n) is None]


def check_tp_size(cfg: ModelConfig, tp_size: int, gpu: GpuSpec | None = None) -> None:
    """Refuse a tensor-parallel size that the model cannot be split into or cgtool cannot cost."""
    sizes = [str(n) for n in valid_tp_sizes(cfg)]
    listed = f"{', '.join(sizes[:-1])} or {sizes[-1]}" if len(sizes) > 1 else sizes[0]
    remedy = f"Use --tp {listed} for {cfg.name}."
    if tp_size < 1:
        raise CgtoolError(f"--tp {tp_size} is not a number of GPUs", remedy)
    if tp_size > MAX_TP_SIZE:
        raise CgtoolError(
            f"--tp {tp_size} spans more than one {MAX_TP_SIZE}-GPU server, "
            "whose network cgtool does not model",
            remedy,
        )
    problem = _tp_problem(cfg, tp_size)
    if problem:
        raise CgtoolError(f"--tp {tp_size} {problem}", remedy)
    if tp_size > 1 and gpu is not None and gpu.link_bytes_s <= 0:
        raise CgtoolError(
            f"--tp {tp_size}: cgtool's GPU table has no GPU-to-GPU link figures for {gpu.name}",
            "Plan with --tp 1, or name a GPU from the table with --gpu.",
        )


def allreduce_ms(gpu: GpuSpec, num_bytes: np.ndarray, tp_size: int) -> np.ndarray:
    """One ring all-reduce of `num_bytes` per rank: each rank sends and receives 2(N-1)/N of
    the buffer, plus a per-call latency."""
    if tp_size == 1:
        return np.zeros_like(num_bytes, dtype=np.float64)
    wire = 2.0 * (tp_size - 1) / tp_size * num_bytes / (gpu.link_bytes_s * _LINK_EFFICIENCY)
    return (wire + gpu.link_latency_s) * 1e3


def allgather_ms(gpu: GpuSpec, num_bytes: np.ndarray, tp_size: int) -> np.ndarray:
    """One all-gather whose result is `num_bytes`: each rank receives (N-1)/N of it."""
    if tp_size == 1:
        return np.zeros_like(num_bytes, dtype=np.float64)
    wire = (tp_size - 1) / tp_size * num_bytes / (gpu.link_bytes_s * _LINK_EFFICIENCY)
    return (wire + gpu.link_latency_s) * 1e3


def allreduces_per_forward(cfg: ModelConfig, tp_size: int) -> int:
    # After O and after down in every layer, and after the vocab-parallel embedding.
    return 0 if tp_size == 1 else 2 * cfg.num_layers + 1


def collectives_per_forward(cfg: ModelConfig, tp_size: int) -> int:
    """Kernels the collectives add to a forward: the all-reduces and the logits' all-gather."""
    return 0 if tp_size == 1 else allreduces_per_forward(cfg, tp_size) + 1


def comm_ms(
    cfg: ModelConfig, gpu: GpuSpec, tp_size: int, rows: np.ndarray, logit_rows: np.ndarray
) -> np.ndarray:
    """Collectives of one forward over `rows` tokens, `logit_rows` of which produce logits.
    A graph replays them as they are: it removes their launches, not their transfers."""
    hidden = np.asarray(rows, dtype=np.float64) * cfg.hidden_size * BF16_BYTES
    logits = np.asarray(logit_rows, dtype=np.float64) * cfg.vocab_size * BF16_BYTES
    calls = allreduces_per_forward(cfg, tp_size)
    return calls * allreduce_ms(gpu, hidden, tp_size) + allgather_ms(gpu, logits, tp_size)
