"""cgtool's attention, layer and MoE kernels compile for Hopper (sm_90), on a machine without a GPU.

The other CPU tests run the kernels in Triton's interpreter, which accepts code the compiler
refuses (tests/sm90_compile.py says which). This compiles them as the GPU would, in a process
without TRITON_INTERPRET, with Triton's NVIDIA backend and its ptxas.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


@pytest.mark.skipif(not PTXAS.exists(), reason="this Triton has no NVIDIA backend to compile with")
def test_kernels_compile_for_hopper_as_the_backends_launch_them():
    from sm90_compile import cases

    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("sm90_compile.py")
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=900,
                          check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    compiled = [line for line in done.stdout.splitlines() if line.startswith("compiled ")]
    assert len(compiled) == len(cases()) >= 68
