"""Which runner records prefill graphs, decided once for capture, verify and replay: the one
--prefill-backend names, else the targeted engine release's."""

from __future__ import annotations

from typing import Any

from cgtool.errors import CgtoolError
from cgtool.planner.releases import release_rules

PREFILL_BACKENDS = ("piecewise", "breakable")


def choose_prefill_backend(asked: str | None, engine: str | None = None, version: str | None = None) -> str:
    """`asked` when given; else "breakable" where the release records prefill graphs as
    breakable CUDA graphs (SGLang 0.5.23), and "piecewise" (torch.compile pieces) for other
    releases, a release cgtool has no rules for, or none named."""
    if asked is not None:
        return asked
    if engine is None:
        return "piecewise"
    try:
        rules = release_rules(engine, version)
    except CgtoolError:  # a release cgtool has no rules for (plans of 0.4 name one): its pieces
        return "piecewise"
    return "breakable" if rules.prefill_backend == "breakable" else "piecewise"


def prefill_runner(
    backend: str, model_runner: Any, capture_num_tokens: list[int], enable_cudagraph_gc: bool = False,
    **compile_options: Any,
) -> Any:
    """The backend's runner, not yet warmed up; `compile_options` (compiler, compile cache)
    are the piecewise runner's, as breakable graphs compile nothing."""
    if backend == "breakable":
        from cgtool.runners.breakable import BreakableGraphRunner

        return BreakableGraphRunner(model_runner, capture_num_tokens, enable_cudagraph_gc)
    from cgtool.runners.piecewise import PiecewiseGraphRunner

    return PiecewiseGraphRunner(model_runner, capture_num_tokens=capture_num_tokens,
                                enable_cudagraph_gc=enable_cudagraph_gc, **compile_options)
