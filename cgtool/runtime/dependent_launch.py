"""Programmatic dependent launch (Hopper on) for Triton kernels that follow each other closely.

A kernel launched with it (`launch_pdl`) is scheduled while the kernel before it finishes, and
waits in `griddepcontrol.wait` (Triton's `gdc_wait`) for that kernel's results, so a replay
does not pay each launch's start after the last one's end. One token's MoE layer (router,
gate/up, down: three launches of a few microseconds' work each) takes it, and so do MLA
decode's merge kernel after its stage 1 and its Gluon stage 1 after the step's K/V store
(which releases it at once); see docs/moe-mla.md.
"""

from __future__ import annotations

import os
from functools import cache

import torch
import triton
import triton.language as tl

# Kernels that take it wait first of all, and release their successor (let it be scheduled)
# after their main loop. Released at their start instead, one token's MoE layer ran 2-3 us
# slower than with ordinary launches; released there, 2.0 us faster for qwen3-30b-a3b and
# 0.1-0.3 slower for deepseek-v2-lite, and qwen3-30b-a3b's whole decode bs 1 step 6.5% faster
# (H200 and H100, benchmarks/results/h*-2026-11-26-pdl-tails). CGTOOL_DEPENDENT_LAUNCH=0 turns
# it off for a process (a driver that mishandles it, or timing both ways); benchmarks flip the
# flag itself.
DEPENDENT_LAUNCH_ENV = "CGTOOL_DEPENDENT_LAUNCH"
DEPENDENT_LAUNCH = os.environ.get(DEPENDENT_LAUNCH_ENV, "1") != "0"


@cache
def _dependent_launch_usable(device_index: int) -> bool:
    try:
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def dependent_launch(device: torch.device) -> dict[str, bool]:
    """Launch options of a kernel with a `PDL` constexpr: launched as a programmatic dependent
    on a GPU that has it (and this Triton), an ordinary launch elsewhere and in the interpreter."""
    if DEPENDENT_LAUNCH and device.type == "cuda" and _dependent_launch_usable(
        torch.cuda.current_device() if device.index is None else device.index
    ):
        return {"PDL": True, "launch_pdl": True}
    return {"PDL": False}


def in_effect(device: torch.device) -> bool:
    """Whether kernels that take it are launched as dependents on `device` (a report records it)."""
    return bool(dependent_launch(device)["PDL"])


@triton.jit
def wait_for_previous_kernel(PDL: tl.constexpr):
    """With PDL, waits until the kernel before has finished and its writes are visible: the
    first thing such a kernel does."""
    if PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def release_next_kernel(PDL: tl.constexpr):
    """With PDL, lets the next kernel be scheduled; it still waits for this one to finish."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
