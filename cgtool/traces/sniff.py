"""Which public format a file looks like, to hint `--format` when it was read as cgtool's."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

from cgtool.traces.fields import GZIP_MAGIC

# A file's first non-empty line, and what marks each format in it.
_SIGNS: dict[str, tuple[str, ...]] = {
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "burstgpt": ("Timestamp", "Request tokens", "Response tokens"),
    "mooncake": ('"input_length"', '"output_length"'),
    "sglang-log": ("Prefill batch",),
    "vllm-metrics": ("CUDAGraph",),
}


def guess_format(path: str | Path, max_lines: int = 50) -> str | None:
    """The format whose marks appear in the file's first lines, or None (cheap: a few KiB)."""
    try:
        with open(path, "rb") as raw:
            gzipped = raw.read(2) == GZIP_MAGIC
        opener = gzip.open if gzipped else open
        with opener(path, "rt", encoding="utf-8", errors="replace") as handle:
            head = [line for _, line in zip(range(max_lines), handle)]
    except (OSError, EOFError, zlib.error):  # a damaged gzip is read_lines' to report
        return None
    for name, signs in _SIGNS.items():
        if any(all(sign in line for sign in signs) for line in head):
            return name
    return None
