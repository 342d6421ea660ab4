"""Hypothesis settings and a scratch folder shared by the fuzz tests of readers and converters."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings

_WORKDIR = Path(tempfile.mkdtemp(prefix="cgtool-fuzz-"))


def fuzz(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,  # leave nothing behind in the repository
        suppress_health_check=[HealthCheck.too_slow],
    )


def fuzz_file(content: bytes | str, name: str = "trace.jsonl") -> Path:
    """Overwritten by every example: a generated file lives only as long as its parse."""
    path = _WORKDIR / name
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_bytes(content)
    return path
