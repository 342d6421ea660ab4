"""Running cgtool's CLI from tests: in process through Typer's runner, or as the installed
script with stdout a pipe, as in a CI log or `| cat`."""

from __future__ import annotations

import os
import subprocess
import sys

from typer.testing import CliRunner, Result

from cgtool.commands.main import app

runner = CliRunner()


def cgtool(*args: object) -> Result:
    return runner.invoke(app, [str(a) for a in args])


def piped(*args: str, timeout_s: int = 120) -> subprocess.CompletedProcess[str]:
    """Exit 0 asserted. Without COLUMNS and a terminal, Rich would fall back to 80 columns
    and cut cells: the output shows whether tables stay whole."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    proc = subprocess.run([sys.executable, "-m", "cgtool.commands.entry", *args], check=False,
                          capture_output=True, text=True, env=env, timeout=timeout_s)
    assert proc.returncode == 0, proc.stderr
    return proc
