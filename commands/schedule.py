"""`cgtool schedule`."""

from __future__ import annotations

from cgtool.commands.common import not_available


def schedule() -> None:
    """Print an engine's default capture schedule (SGLang, vLLM, TensorRT-LLM)."""
    not_available("schedule")
