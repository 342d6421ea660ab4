"""Triton launches without Triton's per-call specialisation pass.

`kernel[grid](...)` re-derives on every call the specialisation of each argument (dtype and
16-byte alignment of tensors; integers equal to 1, divisible by 16, or past int32) to find
its compiled kernel: about 60 µs a launch on the H100 host, 12 ms of an eager 8B decode step
(../shared/notes/eager-host-profile.md). The compiled kernel depends on nothing else, so a
key built from those same properties finds it again, and launching it costs one C call.
The first call of each key goes through Triton as usual and compiles.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

_INT32 = range(-(2**31), 2**31)


def _spec(arg: object) -> object:
    # Stricter than Triton's own key is safe (an extra compile); looser would launch a kernel
    # specialised for another argument.
    if isinstance(arg, torch.Tensor):
        return arg.dtype, arg.data_ptr() % 16 == 0
    if isinstance(arg, bool):
        return arg
    if isinstance(arg, int):
        return arg == 1, arg % 16 == 0, arg in _INT32
    return type(arg)


class CachedKernel:
    """Wraps a `@triton.jit` function whose constexpr parameters all come last."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        # Read from the Python signature, as Triton does: its interpreter has no `params`.
        params = list(inspect.signature(fn.fn).parameters.values())
        is_constexpr = ["constexpr" in str(p.annotation) for p in params]
        num_runtime = is_constexpr.count(False)
        if any(is_constexpr[:num_runtime]):
            raise ValueError(f"{fn.fn.__name__}: constexpr parameters must come last")
        self.constexprs = [p.name for p in params[num_runtime:]]
        self.compiled: dict[tuple[object, ...], Any] = {}

    def launch(self, grid: tuple[int, ...], *args: object, **meta: object) -> None:
        """`args` are the runtime arguments in order; `meta` the constexprs and launch options."""
        key = (tuple(map(_spec, args)), tuple(sorted(meta.items())))
        kernel = self.compiled.get(key)
        if kernel is None:
            kernel = self.fn[grid](*args, **meta)
            # Triton's interpreter (TRITON_INTERPRET=1, the CPU tests) returns no kernel.
            if kernel is not None and hasattr(kernel, "function"):
                self.compiled[key] = kernel
            return
        grid3 = (grid + (1, 1))[:3]
        kernel[grid3](*args, *(meta[name] for name in self.constexprs))
