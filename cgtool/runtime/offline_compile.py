"""Triton kernels compiled for a GPU that is not here: Triton's NVIDIA backend needs none.

The CPU tests run the kernels in Triton's interpreter, which accepts code the compiler refuses,
so tests/sm90_compile.py also compiles them for Hopper; benchmarks/inspect_mla_loop.py reads
the SASS of one. Both need `@triton.jit` functions the compiler sees, not the interpreter's
(no TRITON_INTERPRET in the process).
"""

from __future__ import annotations

import inspect
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

# Scalar arguments of the kernels that are floats, by name; every other scalar is an integer.
FLOAT_ARGUMENTS = frozenset({"scale_log2", "scale", "eps"})
# `launch_signature`'s type of an i32 argument that launches pass as a multiple of 16.
MULTIPLE_OF_16 = "i32 multiple of 16"


def launch_signature(kernel: Any, constants: dict[str, object], types: dict[str, str]) -> tuple[dict, dict, dict]:
    """(signature, constexprs, attrs) of `kernel` as a launch would give them: `constants` the
    constexprs, `types` the Triton types of arguments by name (pointers, "*...", 16-byte
    aligned; MULTIPLE_OF_16, an i32 whose launches pass multiples of 16, such as a GEMM's
    depth); arguments named in neither are fp32 if in FLOAT_ARGUMENTS, else i32, those named
    stride_* multiples of 16. A launch specializes an integer that is a multiple of 16 so, and
    the compiler vectorizes loads it bounds only then."""
    parameters = inspect.signature(kernel.fn).parameters
    params = list(parameters)
    # A constexpr the launch leaves at its default, and a None (which a launch makes a constexpr).
    defaults = {name: p.default for name, p in parameters.items() if name not in constants and name not in types
                and p.default is not inspect.Parameter.empty and ("constexpr" in str(p.annotation) or p.default is None)}
    constants = {**defaults, **constants}
    signature, attrs = {}, {}
    for i, name in enumerate(params):
        if name in constants:
            signature[name] = "constexpr"
        elif name in types:
            multiple = types[name] == MULTIPLE_OF_16
            signature[name] = "i32" if multiple else types[name]
            if multiple or types[name].startswith("*"):
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in FLOAT_ARGUMENTS:
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
            if name.startswith("stride"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    constexprs = {(params.index(k),): v for k, v in constants.items() if k in params}
    return signature, constexprs, attrs


def compile_for(
    kernel: Any, constants: dict[str, object], types: dict[str, str], num_warps: int, num_stages: int,
    capability: int = 90,
) -> Any:
    """`kernel` compiled for an NVIDIA GPU of `capability` (90: Hopper); raises the compiler's error."""
    signature, constexprs, attrs = launch_signature(kernel, constants, types)
    source_type = ASTSource
    if getattr(kernel, "is_gluon", lambda: False)():  # a @gluon.jit kernel: its source is TTGIR
        from triton.experimental.gluon._runtime import GluonASTSource as source_type
    source = source_type(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", capability, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})


def backend_tool(name: str) -> str:
    """A binary of Triton's NVIDIA backend (ptxas, cuobjdump, nvdisasm)."""
    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def resource_usage(compiled: Any) -> dict[str, int]:
    """Registers a thread and stack bytes a thread (where ptxas spilled registers) of a kernel
    `compile_for` built, from its cubin by the backend's cuobjdump."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([backend_tool("cuobjdump"), "-res-usage", f.name], capture_output=True, text=True,
                               check=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    if found is None:
        raise RuntimeError(f"cuobjdump gave no resource usage: {usage[-300:]}")
    return {"registers": int(found.group(1)), "stack_bytes": int(found.group(2))}
