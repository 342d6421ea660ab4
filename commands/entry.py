"""The `cgtool` console script: quiet on Ctrl-C even while the heavy imports still load."""

from __future__ import annotations

import signal


def _stop_quietly(signum: int, frame: object) -> None:
    raise SystemExit(130)


def main() -> None:
    signal.signal(signal.SIGINT, _stop_quietly)
    from cgtool.commands.main import main as run_cli

    signal.signal(signal.SIGINT, signal.default_int_handler)
    run_cli()


if __name__ == "__main__":
    main()
