"""cgtool.runtime.offline_compile: the signature an offline compile gives a kernel is the one a launch would."""

from __future__ import annotations

import inspect

import pytest

pytest.importorskip("triton")


def test_an_integer_launches_pass_as_a_multiple_of_16_is_specialized_as_a_launch_specializes_it():
    # A launch marks an i32 argument that is a multiple of 16 divisible by 16, and Triton then
    # loads the rows it bounds 16 bytes at a time; compiled without the mark, the TMA grouped
    # GEMM's gathered rows loaded 2 bytes at a time (2026-11-27).
    from cgtool.model.moe_tma_gemm import _grouped_gemm_tma_kernel
    from cgtool.runtime.offline_compile import MULTIPLE_OF_16, launch_signature

    params = list(inspect.signature(_grouped_gemm_tma_kernel.fn).parameters)
    signature, _, attrs = launch_signature(_grouped_gemm_tma_kernel, {"BM": 128},
                                           {"K": MULTIPLE_OF_16, "X": "*bf16", "num_experts": "i32"})
    assert signature["K"] == "i32" and attrs[(params.index("K"),)] == [["tt.divisibility", 16]]
    assert signature["X"] == "*bf16" and attrs[(params.index("X"),)] == [["tt.divisibility", 16]]
    assert signature["num_experts"] == "i32" and (params.index("num_experts"),) not in attrs
    assert signature["stride_x"] == "i32" and attrs[(params.index("stride_x"),)] == [["tt.divisibility", 16]]
    assert signature["BM"] == "constexpr" and (params.index("n_out"),) not in attrs
