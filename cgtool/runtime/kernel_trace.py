"""Timestamps taken inside a Triton kernel, for benchmarks that ask where a launch's time goes.

A kernel with a `TRACE` constexpr and a `Trace` pointer writes, per program, the GPU's global
nanosecond clock at a few named points and the SM it ran on. A profiler sees a launch as one
interval; these show when each program started, how long its main loop and its closing steps
took, and how programs were spread over the SMs (benchmarks/probe_mla_timeline.py). With TRACE
off the stamps are compiled out, so the kernels that ship are unchanged by them.

Each stamp takes an input from the work it should follow: the asm then cannot be moved ahead
of that work, as a stamp without inputs could be.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Slots a program writes: the SM's id, then up to seven stamps.
TRACE_SLOTS = 8
# The PTX both dialects' stamps run: the global nanosecond clock, and the SM's id.
GLOBAL_TIMER_ASM = tl.constexpr("mov.u64 $0, %globaltimer;")
SM_ID_ASM = tl.constexpr("mov.u32 $0, %smid;")


@triton.jit
def stamp_after(value):
    """The global clock (ns), read once `value` (a scalar) has been computed."""
    return tl.inline_asm_elementwise(
        GLOBAL_TIMER_ASM, "=l,r", [value.to(tl.int32, bitcast=False)],
        dtype=tl.int64, is_pure=False, pack=1,
    )


@triton.jit
def sm_id():
    return tl.inline_asm_elementwise(SM_ID_ASM, "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def trace_store(Trace, program, slot: tl.constexpr, value):
    """Slot `slot` of `program`'s row (TRACE_SLOTS int64 a program)."""
    tl.store(Trace + program * 8 + slot, value.to(tl.int64))


try:  # Gluon kernels (gluon_mla_wgmma) take the same stamps through Gluon's own ops
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
except ImportError:  # pragma: no cover - depends on the installed Triton
    gluon = None

if gluon is not None:

    @gluon.jit
    def gluon_stamp_after(value):
        """stamp_after in a Gluon kernel."""
        return gl.inline_asm_elementwise(GLOBAL_TIMER_ASM, "=l,r", [value.to(gl.int32)],
                                         dtype=gl.int64, is_pure=False, pack=1)

    @gluon.jit
    def gluon_sm_id(value):
        """sm_id in a Gluon kernel (`value`, any scalar, only gives the asm an operand)."""
        return gl.inline_asm_elementwise(SM_ID_ASM, "=r,r", [value.to(gl.int32)],
                                         dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def gluon_trace_store(Trace, program, slot: gl.constexpr, value):
        """trace_store in a Gluon kernel."""
        gl.store(Trace + program * 8 + slot, value.to(gl.int64))
