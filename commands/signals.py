"""Ctrl-C and SIGTERM for long commands: stop cleanly and keep what was gathered."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}  # 128 + signal number, as shells report


class Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an exception so the partial result is written on the way out."""


def _signal_of(interrupt: KeyboardInterrupt) -> signal.Signals:
    return signal.SIGTERM if isinstance(interrupt, Terminated) else signal.SIGINT


def exit_code(interrupt: KeyboardInterrupt) -> int:
    return EXIT_CODES[_signal_of(interrupt)]


def signal_name(interrupt: KeyboardInterrupt) -> str:
    return _signal_of(interrupt).name


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    def raise_terminated(signum: int, frame: object) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class StopRequest:
    """Raises at once, like Python's default, until `defer()`; after that a signal is only
    recorded, for work that polls `requested()` and stops itself at a consistent point."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.deferring = False

    def defer(self) -> None:
        self.deferring = True

    def requested(self) -> bool:
        return self.signum is not None

    def exit_code(self) -> int:
        return EXIT_CODES[signal.Signals(self.signum)] if self.signum is not None else 0

    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def _handle(self, signum: int, frame: object) -> None:
        # A second signal while deferring means "now": the user will not wait for the poll.
        repeated = self.signum is not None
        self.signum = self.signum or signum
        if repeated or not self.deferring:
            raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()

    @contextmanager
    def installed(self) -> Iterator[StopRequest]:
        previous = {s: signal.signal(s, self._handle) for s in EXIT_CODES}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
