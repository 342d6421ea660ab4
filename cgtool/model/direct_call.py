"""Calling a per-step module straight into its `forward`.

`nn.Module.__call__` checks for hooks, tracing and the backward state on every call: a few
microseconds each, and an eager 8B decode step calls some 320 modules (issue 14: eager is
host-bound). The decoder's modules register no hooks, so nothing is lost by skipping it;
dynamo traces the shorter `__call__` just the same.
"""

from __future__ import annotations

from typing import Any


class DirectCall:
    """Mixed in before `nn.Module` (or a subclass of it) in a module's bases."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)  # type: ignore[attr-defined]
