"""The step's flat plan of gluon_mla_wgmma's programs: the kernel against its Python statement,
and what the mapping promises stage 1 and the merge (every program's request and chunk, every
request's slots once).

Runs in Triton's interpreter without a GPU (conftest sets TRITON_INTERPRET); on the GPU,
test_mla_gpu.py runs stage 1 and the projection over it.
"""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="interpreter tests; on a GPU, test_mla_gpu.py runs the kernels over it"
)

from cgtool.attention.mla_flat_plan import ENTRY, FIELDS, flat_plan, flat_plan_ref

PROGRAMS, MIN_CHUNK, BLOCK_N = 132, 128, 64
BATCHES = {
    "equal": [1024] * 20,
    "one long among short": [300] * 40 + [16000],
    "zero and tiny lengths": [0, 5, 1024, 64, 128],
    "padding, one key each": [1] * 17,
    "mixed": [2048] * 16 + [1024],
    "long": [8192] * 32,
    "a whole SM's worth": [1024] * 132,
}


def plan_of(lens: list[int], memo: dict | None = None):
    rows = random.Random(len(lens)).sample(range(4 * len(lens)), len(lens))
    plan = flat_plan(torch.tensor(lens, dtype=torch.int32), torch.tensor(rows, dtype=torch.int32),
                     PROGRAMS, MIN_CHUNK, BLOCK_N, memo)
    return plan, rows


@pytest.mark.parametrize("name", list(BATCHES))
def test_the_kernel_plans_what_the_reference_states(name):
    lens = BATCHES[name]
    plan, rows = plan_of(lens)
    entries, requests = flat_plan_ref(lens, rows, PROGRAMS, MIN_CHUNK, BLOCK_N)
    assert plan.entries.shape == (PROGRAMS + len(lens), ENTRY) and plan.requests.shape == (len(lens), 2)
    assert [tuple(e[: len(FIELDS)]) for e in plan.entries.tolist()] == entries
    assert [tuple(r) for r in plan.requests.tolist()] == requests


@pytest.mark.parametrize("name", list(BATCHES))
def test_each_request_s_keys_are_covered_once_by_its_chunks(name):
    lens = BATCHES[name]
    entries, requests = flat_plan_ref(lens, list(range(len(lens))), PROGRAMS, MIN_CHUNK, BLOCK_N)
    covered = [0] * len(lens)
    for request, chunk, chunks, first, keys, length, _ in entries:
        if request == len(lens):
            continue  # a spare
        assert 0 <= chunk < chunks and keys % BLOCK_N == 0 and keys >= MIN_CHUNK and length == lens[request]
        covered[request] += max(0, min(keys, length - chunk * keys))
        assert requests[request][0] == first
    assert covered == lens
    # At most one slot a program, the requests' slots end to end, a request of no keys none.
    assert sum(c for _, c in requests) <= PROGRAMS + len(lens)
    assert all(c == 0 for (_, c), n in zip(requests, lens) if n == 0)


def test_the_chunks_follow_the_requests_share_of_the_key_tiles():
    # One 16k request among 40 of 300 keys takes most of the programs, uncapped.
    _, requests = flat_plan_ref(BATCHES["one long among short"], list(range(41)), PROGRAMS, MIN_CHUNK, BLOCK_N)
    assert requests[-1][1] >= 60 and all(c == 1 for _, c in requests[:-1])
    # Padding of one key a request: one chunk each, as the batch alone would share them.
    _, padded = flat_plan_ref([1] * 17, list(range(17)), PROGRAMS, MIN_CHUNK, BLOCK_N)
    assert [c for _, c in padded] == [1] * 17


def test_a_forward_s_layers_share_one_plan():
    memo: dict = {}
    lens = torch.tensor(BATCHES["equal"], dtype=torch.int32)
    rows = torch.arange(20, dtype=torch.int32)
    first = flat_plan(lens, rows, PROGRAMS, MIN_CHUNK, BLOCK_N, memo)
    again = flat_plan(lens, rows, PROGRAMS, MIN_CHUNK, BLOCK_N, memo)
    assert first.fresh and not again.fresh and again.entries is first.entries
    # Other lengths' tensors, or another least chunk, are another plan.
    assert flat_plan(lens.clone(), rows, PROGRAMS, MIN_CHUNK, BLOCK_N, memo).fresh
    assert flat_plan(lens, rows, PROGRAMS, 2 * MIN_CHUNK, BLOCK_N, memo).fresh


def test_the_program_count_is_a_runtime_argument_of_both_kernels():
    # plan_programs gives 12 of a deepseek-v2-lite plan's 27 sizes from 5 to 64 (H200,
    # 2026-11-28) fewer than 132 programs, in 10 counts; as a constexpr each count compiled the
    # plan kernel and stage 1 again at its first capture (about 1 s each under Triton 3.6).
    import inspect

    from cgtool.attention import gluon_mla_wgmma
    from cgtool.attention.mla_flat_plan import _flat_plan_kernel

    kernels = [_flat_plan_kernel]
    if gluon_mla_wgmma.gluon is not None:
        kernels.append(gluon_mla_wgmma._mla_decode_stage1_wgmma)
    for kernel in kernels:
        params = inspect.signature(kernel.fn).parameters
        assert "programs" in params and "constexpr" not in str(params["programs"].annotation), kernel.fn.__name__
        assert "PROGRAMS" not in params, kernel.fn.__name__
