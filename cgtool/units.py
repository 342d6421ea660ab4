"""Byte units and the sizes of the dtypes cgtool reasons about: decided here, once."""

from __future__ import annotations

MIB = 1 << 20
GIB = 1 << 30
BF16_BYTES = 2  # weights, activations and the KV cache
FP32_BYTES = 4  # logits
INT64_BYTES = 8  # positions and indices in SGLang's graph buffers
INT32_BYTES = 4
UINT8_BYTES = 1  # masks



def counted(count: int, noun: str) -> str:
    """`1 request`, `2,048 requests`: a count and its noun, plural unless the count is one."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


# Lower-cased unit names to bytes: decimal for "GB" and bare letters, binary for "GiB". Read by
# the --budget-memory parser and by the parser of PyTorch's out-of-memory message.
BYTE_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "kib": 1 << 10,
    "mib": MIB,
    "gib": GIB,
    "tib": 1 << 40,
}
