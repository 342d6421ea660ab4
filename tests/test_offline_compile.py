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


def test_a_constexpr_left_at_its_default_compiles_as_that_constant():
    # A launch that leaves a constexpr out passes its default as a constant; compiled as an i32
    # instead, a branch the default turns off was built and failed (2026-11-27, a trial's
    # `if WEIGHT_PIECES > 0` over a pointer defaulting to None). A None default is a constant
    # too, unless the types name the argument.
    import triton
    import triton.language as tl

    from cgtool.runtime.offline_compile import launch_signature

    @triton.jit
    def kernel(X, n, Extra=None, PIECES: tl.constexpr = 0, BLOCK: tl.constexpr = 16):
        pass

    params = ["X", "n", "Extra", "PIECES", "BLOCK"]
    signature, constexprs, _ = launch_signature(kernel, {"BLOCK": 32}, {"X": "*bf16"})
    assert [signature[p] for p in params] == ["*bf16", "i32", "constexpr", "constexpr", "constexpr"]
    assert constexprs == {(2,): None, (3,): 0, (4,): 32}
    signature, constexprs, _ = launch_signature(kernel, {}, {"X": "*bf16", "Extra": "*bf16"})
    assert signature["Extra"] == "*bf16" and (2,) not in constexprs and constexprs[(4,)] == 16
