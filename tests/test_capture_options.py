"""SessionState.phase: a phase names itself wherever in it a signal lands."""

from __future__ import annotations

import pytest

from cgtool.capture.options import SessionState


def test_a_signal_while_the_phase_checkpoint_is_written_names_that_phase():
    # The checkpoint (report.json saved as the phase begins) takes a while; a SIGTERM there
    # left the reason without its phase on the GPU ("interrupted by SIGTERM", no "during").
    state = SessionState()

    def checkpoint(name: str) -> None:
        raise KeyboardInterrupt

    state.on_phase = checkpoint
    with pytest.raises(KeyboardInterrupt), state.phase("compile"):
        pass
    assert state.stopped_in == "compile"
    assert "compile" in state.phase_s


def test_the_checkpoint_is_not_counted_in_the_phase():
    state = SessionState()
    state.on_phase = lambda name: __import__("time").sleep(0.05)
    with state.phase("measure"):
        pass
    assert state.phase_s["measure"] < 0.05
