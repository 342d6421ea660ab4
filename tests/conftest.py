import atexit
import os
import shutil
import tempfile

import pytest
import torch
from hypothesis import settings

# Property tests draw the same examples on every run and never read or write Hypothesis's
# example database: a test that passes in CI passes on a fresh clone, and one example found
# failing once is pinned in the test with @example instead of being replayed from a local file.
settings.register_profile("cgtool", derandomize=True, database=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "cgtool"))

# Without a GPU, Triton kernels run in Triton's numpy interpreter. The flag is read when a
# kernel is decorated, so it must be set before any test imports cgtool's Triton modules.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Captures in tests (and the CLI processes they start) keep their compile cache in a folder of
# this session, never the user's: a test sees only the entries this session wrote.
_COMPILE_CACHE = tempfile.mkdtemp(prefix="cgtool-test-compile-cache-")
os.environ["CGTOOL_CACHE_DIR"] = _COMPILE_CACHE
atexit.register(shutil.rmtree, _COMPILE_CACHE, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: run scripts/gpu-check.sh on the GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)



@pytest.fixture(scope="module")
def roofline():
    """The planner's roofline cost model of Llama 3.1 8B on an H100 (tests/planner_fixture.py)."""
    from planner_fixture import roofline_8b

    return roofline_8b()
