"""Name the cause when a capture or replay goes wrong, instead of PyTorch's internal message.

Three mistakes account for most failed captures: an op that waits for the host (`.item()`,
`.tolist()`, a copy from pageable CPU memory, a data-dependent shape) inside the captured
forward; an input buffer replaced after capture, so the graph reads memory that is no longer
the input; and sizes above what the model or pool was built for.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from cgtool.errors import CgtoolError

_CAPTURE_ERROR_MARKS = ("stream is capturing", "StreamCapture", "capture sequence")
# A full device met by a driver call, not by PyTorch's caching allocator: instantiating a
# captured graph takes device memory outside the allocator, and CUDA's error comes up as a
# plain CUDA error (torch.AcceleratorError), not torch.OutOfMemoryError. Breakable prefill
# graphs, each size instantiated layer by layer, met it first (qwen3-30b-a3b's default set at
# its plan's fraction, H200, 2026-11-26).
_DRIVER_OUT_OF_MEMORY = "CUDA error: out of memory"


def is_out_of_memory(error: BaseException) -> bool:
    """The caching allocator's out-of-memory error, or the driver's."""
    return isinstance(error, torch.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and _DRIVER_OUT_OF_MEMORY in str(error)
    )


class CapturePitfall(CgtoolError):
    """A capture failed for a reason in the captured code that the user can fix."""


def is_capture_error(error: BaseException) -> bool:
    text = str(error)
    return isinstance(error, RuntimeError) and any(mark in text for mark in _CAPTURE_ERROR_MARKS)


def diagnose_capture_error(kind: str, size: int, forward: Callable[[], object]) -> CapturePitfall:
    """Run `forward` eagerly with CUDA's sync debugging set to raise, to find the op that
    waits for the host; name its source line."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        forward()
    except RuntimeError as sync_error:
        where = _user_frame(sync_error)
        return CapturePitfall(
            f"{kind} size {size}: the captured forward waits for the host at {where}; "
            "a CUDA graph cannot record that (an .item(), .tolist(), a copy from CPU memory "
            "or a data-dependent shape)",
            "Compute the value before capture or keep it on the GPU.",
        )
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    return CapturePitfall(
        f"{kind} size {size}: CUDA refused the capture, yet the forward does not wait for the host "
        "when run on its own",
        "Run with CGTOOL_DEBUG=1 for PyTorch's own message.",
    )


def _user_frame(error: BaseException) -> str:
    """The innermost frame outside torch: where the offending op was called."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if "/torch/" not in f.filename]
    if not frames:
        return "an op inside torch"
    frame = frames[-1]
    return f"{Path(frame.filename).name}:{frame.lineno} (`{(frame.line or '').strip()}`)"


class StaticInputs:
    """The addresses a graph was recorded with; replay checks them, since a buffer replaced
    after capture would leave the graph reading freed or foreign memory without any error."""

    def __init__(self, **buffers: torch.Tensor) -> None:
        self.addresses = {name: t.data_ptr() for name, t in buffers.items()}

    def check(self, **buffers: torch.Tensor) -> None:
        for name, tensor in buffers.items():
            if tensor.data_ptr() != self.addresses[name]:
                raise CapturePitfall(
                    f"static input '{name}' moved after capture (0x{self.addresses[name]:x} → "
                    f"0x{tensor.data_ptr():x}); the graphs still read the old address",
                    f"Copy new values into the captured '{name}' buffer (copy_) instead of replacing it.",
                )
