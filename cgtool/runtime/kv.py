"""SGLang's token-granular KV pool: per-layer K/V slots plus req_to_token."""

from __future__ import annotations

import gc

import torch

from cgtool.errors import EnvironmentProblem
from cgtool.runtime.kv_store import store_kv
from cgtool.specs.config import ModelConfig

# Slot 0 and request row 0 are never handed out: padded batch entries write and read there.
DUMMY_SLOT = 0
DUMMY_REQ = 0


def free_after_weights() -> tuple[int, int]:
    """(free, total) device bytes once the weights are loaded, read as SGLang reads them before
    sizing its pool: the caching allocator's free blocks handed back first. Blocks cached by the
    weights' loading or by an earlier session in this process would otherwise read as used,
    and the pool would come out smaller than a fresh server's."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    return free, total


def kv_budget_bytes(total_bytes: int, free_after_weights_bytes: int, mem_fraction_static: float) -> int:
    """SGLang's rule: KV gets what is free after weights, minus the (1 - fraction) share of total."""
    return int(free_after_weights_bytes - total_bytes * (1.0 - mem_fraction_static))


def kv_tokens_for_budget(cfg: ModelConfig, budget_bytes: int, dtype: torch.dtype) -> int:
    per_token = cfg.kv_bytes_per_token(torch.finfo(dtype).bits // 8)
    return max(0, budget_bytes // per_token)


class KVPool:
    def __init__(
        self,
        cfg: ModelConfig,
        num_slots: int,
        max_reqs: int,
        max_context_len: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        if num_slots < 2:
            raise EnvironmentProblem(
                f"the KV pool would hold {num_slots} tokens",
                "Raise --mem-fraction-static or use a smaller model.",
            )
        shape = (num_slots, cfg.num_kv_heads, cfg.head_dim)  # [num_slots, kv_heads, head_dim]
        self.k_buffers = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        # MLA keeps one latent per token ([num_slots, 1, kv_lora_rank + rope]), read as both K
        # and V: the V buffers are the K buffers.
        self.v_buffers = self.k_buffers if cfg.kv_buffers_per_layer == 1 else [
            torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)
        ]
        # Attention reads a V row's first value_dim values: MLA's latent values are its
        # compressed KV (kv_lora_rank), the rotated key (rope) after them is key only.
        self.value_dim = cfg.mla.kv_lora_rank if cfg.mla else cfg.head_dim
        # [max_reqs, max_context_len]: each request's positions → KV slots
        self.req_to_token = torch.zeros((max_reqs, max_context_len), dtype=torch.int32, device=device)
        self.num_slots = num_slots
        self.max_reqs = max_reqs
        self.max_context_len = max_context_len
        self._next_slot = DUMMY_SLOT + 1
        self._next_req = DUMMY_REQ + 1

    @property
    def is_latent(self) -> bool:
        """One latent buffer per layer, read as both K and V (MLA)."""
        return self.v_buffers is self.k_buffers

    @property
    def nbytes(self) -> int:
        buffers = self.k_buffers if self.is_latent else self.k_buffers + self.v_buffers
        return sum(b.numel() * b.element_size() for b in buffers)

    def store(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """The tokens' new K and V into their slots `loc`; a latent pool stores K alone."""
        v_cache = None if self.is_latent else self.v_buffers[layer_id]
        store_kv(self.k_buffers[layer_id], v_cache, loc, k, None if self.is_latent else v)

    def alloc_request(self, seq_len: int) -> tuple[int, torch.Tensor]:
        """Give a request a row and `seq_len` fresh slots (bump allocation; enough for profiling)."""
        if self._next_req >= self.max_reqs or self._next_slot + seq_len > self.num_slots:
            raise EnvironmentProblem(
                f"the KV pool is full ({self.num_slots} slots, {self.max_reqs} requests)",
                "Use fewer or shorter requests, or raise --mem-fraction-static.",
            )
        if seq_len > self.max_context_len:
            raise EnvironmentProblem(
                f"a request of {seq_len} tokens exceeds the context length {self.max_context_len}",
                "Lower --context-len or the request length.",
            )
        req = self._next_req
        slots = torch.arange(self._next_slot, self._next_slot + seq_len, dtype=torch.int32)
        self.req_to_token[req, :seq_len] = slots.to(self.req_to_token.device)
        self._next_req += 1
        self._next_slot += seq_len
        return req, slots
