"""Megatron-style tensor parallelism: which slice of each weight a rank holds, and its layers.

Column-parallel layers (QKV, gate/up, the LM head) keep some output rows, row-parallel
layers (O, down) keep input columns and sum their partial products over the ranks. Every
sharded layer is first built whole, exactly as the single-GPU model builds it (same shapes,
same order of random draws), and then keeps this rank's slice: random weights are the same
numbers at any TP size, so TP=N can be checked against TP=1. At TP=1 the layers are plain
nn.Linear / nn.Embedding and no collective is ever called.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from cgtool.errors import ConfigError
from cgtool.model.direct_call import DirectCall
from cgtool.runtime.distributed import TensorParallel, gather_vocab
from cgtool.specs.config import ModelConfig

Range = tuple[int, int]  # [start, stop) along one dimension of a full tensor


def check_tp_shapes(cfg: ModelConfig, tp_size: int) -> None:
    """Refuse TP sizes that do not divide the model's heads and MLP, as SGLang does."""
    kv = cfg.num_kv_heads
    problem = None
    if tp_size > 1 and (cfg.moe or cfg.mla):
        raise ConfigError(
            f"--tp {tp_size}: cgtool does not shard {cfg.name}'s experts or latent attention yet",
            "Use --tp 1 for mixture-of-experts and MLA models.",
        )
    if cfg.num_heads % tp_size:
        problem = f"its {cfg.num_heads} attention heads"
    elif kv % tp_size and tp_size % kv:
        problem = f"its {kv} KV heads (nor is {tp_size} a multiple of them)"
    elif cfg.intermediate_size % tp_size:
        problem = f"its MLP width {cfg.intermediate_size}"
    if problem:
        raise ConfigError(
            f"--tp {tp_size} does not divide {cfg.name}'s {problem.removeprefix('its ')}",
            "Choose a TP size that divides the attention heads, KV heads and MLP width.",
        )


def local_config(cfg: ModelConfig, tp: TensorParallel) -> ModelConfig:
    """This rank's share of the heads and MLP (vocabulary and hidden size stay whole)."""
    if tp.size == 1:
        return cfg
    return dataclasses.replace(
        cfg,
        num_heads=cfg.num_heads // tp.size,
        num_kv_heads=max(1, cfg.num_kv_heads // tp.size),
        intermediate_size=cfg.intermediate_size // tp.size,
    )


def split(total: int, tp: TensorParallel) -> Range:
    shard = total // tp.size
    return tp.rank * shard, (tp.rank + 1) * shard


def kv_head_range(cfg: ModelConfig, tp: TensorParallel) -> Range:
    """KV heads split over ranks; with fewer KV heads than ranks each is replicated."""
    if cfg.num_kv_heads >= tp.size:
        return split(cfg.num_kv_heads, tp)
    head = tp.rank * cfg.num_kv_heads // tp.size  # the KV head of this rank's query heads
    return head, head + 1


def vocab_range(vocab_size: int, tp: TensorParallel) -> tuple[Range, int]:
    """This rank's vocabulary rows, and the padded rows per rank (all ranks hold the same)."""
    shard = -(-vocab_size // tp.size)
    start = min(tp.rank * shard, vocab_size)
    return (start, min(start + shard, vocab_size)), shard


def _keep(full: torch.Tensor, dim: int, part_sizes: list[int], parts: list[Range], rows: int) -> torch.Tensor:
    # Fused tensors (qkv, gate_up) are cut into their parts first, each part sliced on its own.
    pieces = [p.narrow(dim, a, b - a) for p, (a, b) in zip(full.split(part_sizes, dim), parts)]
    kept = torch.cat(pieces, dim)
    if kept.shape[dim] < rows:  # vocabulary padding: rows no token id maps to
        pad = list(kept.shape)
        pad[dim] = rows - kept.shape[dim]
        kept = torch.cat([kept, kept.new_zeros(pad)], dim)
    return kept.contiguous()


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, weight_t: torch.Tensor | None = None
) -> torch.Tensor:
    """`F.linear` called as the op it becomes on 2-D input, `mm` (or `addmm` with a bias) of
    the transposed weight: `at::linear` and `at::matmul` are two dispatches more a call on the
    host, and an eager 8B decode step makes 129 (issue 14). Same kernels, same numbers.
    `weight_t`: `weight.t()` already made (`transposed_weight`)."""
    if x.dim() != 2:
        return F.linear(x, weight, bias)
    weight_t = weight.t() if weight_t is None else weight_t
    return torch.mm(x, weight_t) if bias is None else torch.addmm(bias, x, weight_t)


def transposed_weight(module: nn.Module) -> torch.Tensor:
    """`module.weight.t()`, made once and kept: a view costs ~2 µs of host time, and an eager
    8B decode step makes 129. Made again when the weight is replaced (tied, re-sharded) or its
    storage is (`module.to` swaps a parameter's data in place)."""
    weight = module.weight
    if torch.compiler.is_compiling():
        return weight.t()
    kept = module.__dict__.get("_weight_t")
    if kept is None or kept[0] is not weight or kept[1] != weight.data_ptr():
        kept = module.__dict__["_weight_t"] = (weight, weight.data_ptr(), weight.t())
    return kept[2]


class ColumnParallelLinear(DirectCall, nn.Linear):
    """Output rows split: of each fused part (q|k|v, gate|up) this rank keeps `parts[i]`."""

    def __init__(
        self, in_features: int, part_sizes: list[int], bias: bool, tp: TensorParallel,
        parts: list[Range] | None = None, rows: int | None = None,
    ) -> None:
        super().__init__(in_features, sum(part_sizes), bias=bias)
        self.part_sizes = part_sizes
        self.parts = parts or [(0, n) for n in part_sizes]
        if tp.size > 1:
            rows = rows or sum(b - a for a, b in self.parts)
            self.weight = nn.Parameter(_keep(self.weight.data, 0, part_sizes, self.parts, rows))
            if self.bias is not None:
                self.bias = nn.Parameter(_keep(self.bias.data, 0, part_sizes, self.parts, rows))
            self.out_features = rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, transposed_weight(self))


class RowParallelLinear(DirectCall, nn.Linear):
    """Input columns split; the partial products are summed over the ranks (all-reduce)."""

    def __init__(self, in_features: int, out_features: int, tp: TensorParallel, cols: Range) -> None:
        super().__init__(in_features, out_features, bias=False)
        self.tp_size = tp.size
        self.cols, self.cols_total = cols, in_features
        if tp.size > 1:
            self.weight = nn.Parameter(_keep(self.weight.data, 1, [in_features], [cols], 0))
            self.in_features = cols[1] - cols[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = linear(x, self.weight, weight_t=transposed_weight(self))
        if self.tp_size > 1:
            torch.ops.cgtool.all_reduce(out)
        return out


class VocabParallelEmbedding(DirectCall, nn.Embedding):
    """Vocabulary rows split; ids of other ranks' rows read zeros, and the all-reduce fills them in."""

    def __init__(self, vocab_size: int, hidden: int, tp: TensorParallel) -> None:
        super().__init__(vocab_size, hidden)
        self.tp_size = tp.size
        (self.vocab_start, self.vocab_stop), shard = vocab_range(vocab_size, tp)
        self.parts = [(self.vocab_start, self.vocab_stop)]
        self.part_sizes = [vocab_size]
        if tp.size > 1:
            self.weight = nn.Parameter(_keep(self.weight.data, 0, self.part_sizes, self.parts, shard))
            self.num_embeddings = shard

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return super().forward(ids)
        # Arithmetic, not boolean indexing: no data-dependent shapes, so it stays capturable.
        mine = (ids >= self.vocab_start) & (ids < self.vocab_stop)
        out = F.embedding((ids - self.vocab_start) * mine, self.weight)
        out = out * mine.unsqueeze(-1).to(out.dtype)
        torch.ops.cgtool.all_reduce(out)
        return out


class ParallelLMHead(ColumnParallelLinear):
    """Vocabulary rows split as in the embedding; logits gathered from every rank."""

    def __init__(self, hidden: int, vocab_size: int, tp: TensorParallel) -> None:
        rows, shard = vocab_range(vocab_size, tp)
        super().__init__(hidden, [vocab_size], False, tp, [rows], shard)
        self.tp_size = tp.size
        self.vocab_size = vocab_size

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        local = linear(hidden, self.weight, weight_t=transposed_weight(self))
        return local if self.tp_size == 1 else gather_vocab(local, self.vocab_size)
