"""cgtool's attention, layer and MoE kernels compile for Hopper (sm_90), on a machine without a GPU.

The other CPU tests run the kernels in Triton's interpreter, which accepts code the compiler
refuses (tests/sm90_compile.py says which). This compiles them as the GPU would, in a process
without TRITON_INTERPRET, with Triton's NVIDIA backend and its ptxas, and reads each cubin's
registers and spilled bytes with its cuobjdump: no decode kernel may spill.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
BACKEND_BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


@pytest.mark.skipif(not (BACKEND_BIN / "ptxas").exists() or not (BACKEND_BIN / "cuobjdump").exists(),
                    reason="this Triton has no NVIDIA backend to compile with and read the cubins")
def test_kernels_compile_for_hopper_as_the_backends_launch_them():
    from sm90_compile import cases

    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("sm90_compile.py")
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=900,
                          check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    compiled = [line for line in done.stdout.splitlines() if line.startswith("compiled ")]
    assert len(compiled) == len(cases()) >= 68
    # Each with its registers and spilled bytes; a decode kernel's spill fails the script above.
    assert all(line.endswith(" stack bytes") for line in compiled)
