"""Building blocks: RMSNorm, rotary embedding (with Llama 3 scaling), SwiGLU MLP.

The arithmetic lives in `fused`: Triton kernels on the GPU, the torch reference elsewhere.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from cgtool.model.direct_call import DirectCall
from cgtool.model.fused import apply_rope, fused_add_rms_norm_, rms_norm, silu_and_mul
from cgtool.model.parallel import ColumnParallelLinear, RowParallelLinear, split
from cgtool.runtime.distributed import SINGLE, TensorParallel
from cgtool.specs.config import ModelConfig
from cgtool.specs.config_parts import RopeScaling


class RMSNorm(DirectCall, nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """With a residual: (norm(x + residual), x + residual), the add fused into the norm,
        written over x and residual on the GPU: a layer never reads either again."""
        if residual is None:
            return rms_norm(x, self.weight, self.eps)
        return fused_add_rms_norm_(x, residual, self.weight, self.eps)


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    # Long wavelengths are divided by `factor`, short ones kept, the band between blended.
    old = scaling.original_max_position_embeddings
    low_wavelen = old / scaling.low_freq_factor
    high_wavelen = old / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    blended = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    band = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(band, blended, scaled)


class RotaryEmbedding(DirectCall, nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__()
        dim = cfg.rotary_dim
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        if cfg.rope_scaling is not None:
            inv_freq = _llama3_inv_freq(inv_freq, cfg.rope_scaling)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        # [max_positions, head_dim]: cos and sin halves side by side
        self.register_buffer("cos_sin", torch.cat([freqs.cos(), freqs.sin()], dim=-1), persistent=False)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q/k: [num_tokens, heads, head_dim], maybe strided; rotated into contiguous tensors."""
        return apply_rope(q, k, positions, self.cos_sin)


class SwiGLU(DirectCall, nn.Module):
    def __init__(self, hidden: int, intermediate: int, tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        rows = split(intermediate, tp)
        self.gate_up_proj = ColumnParallelLinear(hidden, [intermediate, intermediate], False, tp, [rows, rows])
        self.down_proj = RowParallelLinear(intermediate, hidden, tp, rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))
