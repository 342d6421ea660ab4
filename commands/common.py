"""What every command shares: the consoles and the error → exit-code mapping."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from rich.console import Console

from cgtool.errors import CgtoolError

console = Console()  # results
err_console = Console(stderr=True)  # progress and errors

F = TypeVar("F", bound=Callable[..., Any])

EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2


def cli_errors(func: F) -> F:
    """Turn a CgtoolError into one line on stderr and exit code 2 (CGTOOL_DEBUG=1 re-raises)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except CgtoolError as exc:
            if os.environ.get("CGTOOL_DEBUG"):
                raise
            err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_BAD_INPUT) from None

    return wrapper  # type: ignore[return-value]


def not_available(command: str) -> None:
    err_console.print(
        f"[bold red]error:[/] `cgtool {command}` is not available yet in this version.",
        highlight=False,
    )
    raise typer.Exit(EXIT_BAD_INPUT)
