"""CachedKernel: Triton compiles once per specialisation; later launches skip its binder."""

from __future__ import annotations

import pytest
import torch

from cgtool.triton_launch import CachedKernel


def _kernel(X, Out, n, scale, BLOCK: "tl.constexpr", EVEN: "tl.constexpr"):  # noqa: F821
    pass


class FakeCompiled:
    function = object()

    def __init__(self, launches: list) -> None:
        self.launches = launches

    def __getitem__(self, grid):
        return lambda *args: self.launches.append(("fast", grid, args))


class FakeJit:
    """Stands in for a `@triton.jit` function: `fn` is the Python body, `[grid]` compiles."""

    fn = staticmethod(_kernel)

    def __init__(self) -> None:
        self.launches: list = []
        self.compiles = 0

    def __getitem__(self, grid):
        def run(*args, **meta):
            self.compiles += 1
            self.launches.append(("jit", grid, args, meta))
            return FakeCompiled(self.launches)

        return run


def test_second_launch_of_a_specialisation_goes_straight_to_the_compiled_kernel():
    jit = FakeJit()
    kernel = CachedKernel(jit)
    x, out = torch.zeros(64), torch.zeros(64)
    kernel.launch((4,), x, out, 64, 0.5, BLOCK=16, EVEN=True, num_warps=4)
    kernel.launch((8, 2), x, out, 32, 0.25, BLOCK=16, EVEN=True, num_warps=4)
    assert jit.compiles == 1
    # Constexprs follow the runtime arguments in signature order; the grid has three axes.
    assert jit.launches[1] == ("fast", (8, 2, 1), (x, out, 32, 0.25, 16, True))


@pytest.mark.parametrize(
    "change",
    [
        lambda x, out: ((x, out, 1, 0.5), {}),  # an int equal to 1 is a constant to Triton
        lambda x, out: ((x, out, 63, 0.5), {}),  # not divisible by 16
        lambda x, out: ((x, out, 2**33, 0.5), {}),  # past int32
        lambda x, out: ((x[1:], out, 64, 0.5), {}),  # a pointer not 16-byte aligned
        lambda x, out: ((x.half(), out, 64, 0.5), {}),  # another dtype
        lambda x, out: ((x, out, 64, 0.5), {"BLOCK": 32}),  # another constexpr
        lambda x, out: ((x, out, 64, 0.5), {"num_warps": 8}),  # another launch option
    ],
)
def test_any_change_triton_specialises_on_compiles_again(change):
    jit = FakeJit()
    kernel = CachedKernel(jit)
    x, out = torch.zeros(64), torch.zeros(64)
    meta = {"BLOCK": 16, "EVEN": True, "num_warps": 4}
    kernel.launch((4,), x, out, 64, 0.5, **meta)
    args, extra = change(x, out)
    kernel.launch((4,), *args, **{**meta, **extra})
    assert jit.compiles == 2


def test_constexprs_before_runtime_arguments_are_refused():
    def bad(BLOCK: "tl.constexpr", X):  # noqa: F821
        pass

    jit = FakeJit()
    jit.fn = bad
    with pytest.raises(ValueError, match="constexpr parameters must come last"):
        CachedKernel(jit)


def test_the_interpreter_returning_no_kernel_is_never_cached():
    jit = FakeJit()
    base = jit.__getitem__
    jit.__class__ = type("Interp", (FakeJit,), {"__getitem__": lambda self, g: lambda *a, **m: base(g)(*a, **m) and None})
    kernel = CachedKernel(jit)
    x = torch.zeros(16)
    kernel.launch((1,), x, x, 16, 1.0, BLOCK=16, EVEN=True)
    kernel.launch((1,), x, x, 16, 1.0, BLOCK=16, EVEN=True)
    assert jit.compiles == 2 and not kernel.compiled
