"""Shared CLI helpers: importing the modules whose GPU kernels need Triton."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cgtool.commands.common import import_gpu_module
from cgtool.errors import EnvironmentProblem

# torch's CPU wheels bring no Triton: `import triton` then raises ModuleNotFoundError, which
# sys.modules[name] = None reproduces where Triton is installed.
_WITHOUT_TRITON = (
    "import sys\n"
    "sys.modules['triton'] = None\n"
    "import torch\n"
    "torch.cuda.is_available = lambda: False\n"
    "from cgtool.commands.entry import main\n"
    "sys.argv = ['cgtool', *sys.argv[1:]]\n"
    "main()\n"
)


@pytest.mark.parametrize(("args", "said"), [
    (["capture", "--kind", "decode", "--bs", "1,2"], "cgtool capture needs a CUDA GPU"),
    (["capture", "--kind", "vit"], "cgtool capture needs a CUDA GPU"),
    (["verify", "--plan", "plan.json"], "cgtool verify needs a CUDA GPU"),
])
def test_gpu_commands_without_triton_name_the_missing_gpu_in_one_line(args, said):
    done = subprocess.run([sys.executable, "-c", _WITHOUT_TRITON, *args],
                          capture_output=True, text=True, check=False, timeout=120)
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and said in lines[0], lines


def test_without_triton_but_with_a_gpu_the_missing_triton_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)
    monkeypatch.delitem(sys.modules, "cgtool.runtime.kv_store", raising=False)
    with pytest.raises(EnvironmentProblem, match="need Triton"):
        import_gpu_module("cgtool.runtime.kv_store", lambda: None)  # a GPU is there: no error from it


def test_other_missing_modules_are_not_taken_for_triton():
    with pytest.raises(ModuleNotFoundError):
        import_gpu_module("cgtool.no_such_module", lambda: None)
