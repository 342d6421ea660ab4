"""Triton launches without Triton's per-call specialisation pass and launch wrapper.

`kernel[grid](...)` re-derives on every call the specialisation of each argument (dtype and
16-byte alignment of tensors; integers equal to 1, divisible by 16, or past int32) to find
its compiled kernel: about 60 µs a launch on the H100 host, 12 ms of an eager 8B decode step
(../shared/notes/eager-host-profile.md). The compiled kernel depends on nothing else, so a
key built from those same properties finds it again. Its C launcher is then called directly,
without the wrapper that looks up the device, stream and launch hooks on each launch.
The first call of each key goes through Triton as usual and compiles.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

_INT32_MIN, _INT32_END = -(2**31), 2**31
_Tensor = torch.Tensor
_ONES = (1, 1)


def _key(args: tuple[object, ...], meta: dict[str, object]) -> tuple[object, ...]:
    # Triton's own key, no stricter (a stricter one only costs a slow launch) and no looser
    # (which would launch a kernel specialised for another argument): tensors by dtype and
    # 16-byte alignment; ints by == 1, divisibility by 16 and int32 range; bools by value;
    # anything else (floats) by type; then the constexprs and launch options by name and
    # value. One flat tuple from one comprehension: a call or a nested tuple per argument
    # cost more (issue 14: ~200 launches an eager step).
    return (*[
        (a.dtype, not a.data_ptr() & 15) if isinstance(a, _Tensor)
        else (a == 1, not a & 15, _INT32_MIN <= a < _INT32_END) if a.__class__ is int
        else a if a.__class__ is bool
        else a.__class__
        for a in args
    ], *meta.items())


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
        self.compiled: dict[tuple[object, ...], Callable[..., None]] = {}

    def launch(self, grid: tuple[int, ...], *args: object, **meta: object) -> None:
        """`args` are the runtime arguments in order; `meta` the constexprs and launch options."""
        key = _key(args, meta)  # call sites pass `meta` in a fixed order
        launcher = self.compiled.get(key)
        if launcher is None:
            kernel = self.fn[grid](*args, **meta)
            # Triton's interpreter (TRITON_INTERPRET=1, the CPU tests) returns no kernel.
            if kernel is not None and hasattr(kernel, "function"):
                self.compiled[key] = _bind(kernel, tuple(meta[name] for name in self.constexprs))
            return
        launcher(grid if len(grid) == 3 else grid + _ONES[: 3 - len(grid)], args)


def _bind(kernel: Any, constexprs: tuple[object, ...]) -> Callable[[tuple[int, ...], tuple[object, ...]], None]:
    """A launcher of one compiled kernel with its constexpr values (part of its key): its C
    launcher called as Triton's own per-launch wrapper would call it (that wrapper looks up
    the device, the stream and the launch hooks on every call). Where this Triton lacks
    those attributes, or launch hooks are set (a Triton profiler), Triton's wrapper is kept."""
    run, function = getattr(kernel, "run", None), getattr(kernel, "function", None)
    packed, raw_stream, device = getattr(kernel, "packed_metadata", None), _raw_stream(), _device_index()
    if run is None or packed is None or raw_stream is None or device is None or _launch_hooks_set():
        return lambda grid3, args: kernel[grid3](*args, *constexprs)

    def launch(grid3: tuple[int, ...], args: tuple[object, ...]) -> None:
        stream = raw_stream(device())  # the capture stream inside a graph
        run(grid3[0], grid3[1], grid3[2], stream, function, packed, None, None, None, *args, *constexprs)

    return launch


def _raw_stream() -> Callable[[int], int] | None:
    return getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _device_index() -> Callable[[], int] | None:
    """torch.cuda.current_device without its Python wrapper (which only lazily initialises
    CUDA, done by the time a kernel was compiled)."""
    return getattr(torch._C, "_cuda_getDevice", None)


def _launch_hooks_set() -> bool:
    try:
        from triton import knobs
    except ImportError:
        return False
    return hook_is_set(knobs.runtime.launch_enter_hook) or hook_is_set(knobs.runtime.launch_exit_hook)


def hook_is_set(hook: object) -> bool:
    """Triton 3.x keeps each launch hook as a chain, empty unless a tool added one; Triton's
    wrapper passes the empty chain on, and builds launch metadata for it, at every launch."""
    return hook is not None and bool(getattr(hook, "calls", True))


def next_power_of_2(n: int) -> int:
    """`triton.next_power_of_2` in plain integer arithmetic: Triton's costs microseconds of
    host time a call (its constexpr wrapper), and eager code makes hundreds a step."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    """`triton.cdiv`, likewise."""
    return -(-a // b)
