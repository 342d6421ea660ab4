"""Byte units and the sizes of the dtypes cgtool reasons about: decided here, once."""

from __future__ import annotations

MIB = 1 << 20
GIB = 1 << 30
BF16_BYTES = 2  # weights, activations and the KV cache
FP32_BYTES = 4  # logits
