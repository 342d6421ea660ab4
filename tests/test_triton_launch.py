"""CachedKernel: Triton compiles once per specialisation; later launches skip its binder."""

from __future__ import annotations

import pytest
import torch

from cgtool.runtime.triton_launch import CachedKernel


def _kernel(X, Out, n, scale, BLOCK: tl.constexpr, EVEN: tl.constexpr):  # noqa: F821
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
    def bad(BLOCK: tl.constexpr, X):  # noqa: F821
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


class FakeLaunchable(FakeCompiled):
    """A compiled kernel as Triton 3.x has it: its C launcher `run` and packed metadata."""

    packed_metadata = object()

    def run(self, *args):
        self.launches.append(("run", args))


def _jit_compiling_to(compiled_cls):
    jit = FakeJit()
    base = jit.__getitem__
    jit.__class__ = type("J", (FakeJit,), {
        "__getitem__": lambda self, g: lambda *a, **m: (base(g)(*a, **m), compiled_cls(self.launches))[1]})
    return jit


def test_a_compiled_kernel_is_launched_through_its_c_launcher_on_the_current_stream(monkeypatch):
    import cgtool.runtime.triton_launch as tl_mod

    monkeypatch.setattr(tl_mod, "_raw_stream", lambda: lambda device: 1000 + device)
    monkeypatch.setattr(tl_mod, "_launch_hooks_set", lambda: False)
    monkeypatch.setattr(tl_mod, "_device_index", lambda: lambda: 3)
    jit = _jit_compiling_to(FakeLaunchable)
    kernel = CachedKernel(jit)
    x = torch.zeros(64)
    kernel.launch((4,), x, x, 64, 0.5, BLOCK=16, EVEN=True, num_warps=4)
    kernel.launch((8, 2), x, x, 64, 0.5, BLOCK=16, EVEN=True, num_warps=4)
    _, args = jit.launches[-1]
    # grid, stream, function, metadata, no launch metadata and no hooks, then the arguments
    assert args[:4] == (8, 2, 1, 1003)
    assert args[4] is FakeLaunchable.function and args[5] is FakeLaunchable.packed_metadata
    assert args[6:9] == (None, None, None) and args[9:] == (x, x, 64, 0.5, 16, True)


def test_with_launch_hooks_set_tritons_own_wrapper_launches(monkeypatch):
    import cgtool.runtime.triton_launch as tl_mod

    monkeypatch.setattr(tl_mod, "_raw_stream", lambda: lambda device: 0)
    monkeypatch.setattr(tl_mod, "_launch_hooks_set", lambda: True)
    jit = _jit_compiling_to(FakeLaunchable)
    kernel = CachedKernel(jit)
    x = torch.zeros(64)
    for _ in range(2):
        kernel.launch((4,), x, x, 64, 0.5, BLOCK=16, EVEN=True)
    assert jit.launches[-1][0] == "fast"  # through __getitem__, which calls the hooks


def test_an_empty_hook_chain_is_no_hook_and_a_filled_one_is():
    from cgtool.runtime.triton_launch import hook_is_set

    class Chain:
        def __init__(self, calls):
            self.calls = calls

    assert not hook_is_set(None) and not hook_is_set(Chain([]))
    assert hook_is_set(Chain([print])) and hook_is_set(print)  # a plain callable, as older Tritons kept


def test_integer_helpers_equal_tritons_own():
    import triton

    from cgtool.runtime.triton_launch import cdiv, next_power_of_2

    for n in [0, *range(1, 300), 1023, 1024, 1025, 2**20 + 1]:
        assert next_power_of_2(n) == triton.next_power_of_2(n)
        for d in (1, 3, 16, 64):
            assert cdiv(n, d) == triton.cdiv(n, d)

