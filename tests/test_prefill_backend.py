"""The one choice of prefill runner that capture, verify and replay share."""

import pytest

from cgtool.capture.prefill_backend import choose_prefill_backend


@pytest.mark.parametrize(("engine", "version", "backend"), [
    ("sglang", "0.5.23", "breakable"), ("sglang", None, "breakable"), ("sglang", "0.5.10", "piecewise"),
    ("vllm", "0.33", "piecewise"), ("sglang", "0.4", "piecewise"), (None, None, "piecewise"),
])
def test_the_targeted_release_picks_the_prefill_backend(engine, version, backend):
    assert choose_prefill_backend(None, engine, version) == backend


def test_an_asked_backend_overrides_the_release():
    assert choose_prefill_backend("piecewise", "sglang", "0.5.23") == "piecewise"
    assert choose_prefill_backend("breakable", "sglang", "0.5.10") == "breakable"
