"""What every command shares: the consoles and the error → exit-code mapping."""

from __future__ import annotations

import functools
import importlib
import os
import tempfile
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from cgtool.errors import CgtoolError, EnvironmentProblem, InputError

# Wide enough for any cgtool table: a log has no width, and at Rich's fallback of 80 columns
# every cell of a wide table is cut to "…".
LOG_WIDTH = 1000
# --help in a log: wide enough that Typer's option table cuts no flag name or default (at 80
# columns `cgtool capture --help` printed `--mem-fraction-s…`), narrow enough to read.
HELP_LOG_WIDTH = 120


def make_console(stderr: bool = False) -> Console:
    """A terminal keeps its own width; a pipe or a CI log gets LOG_WIDTH, so no cell is cut."""
    made = Console(stderr=stderr)
    if not made.is_terminal:
        made.width = LOG_WIDTH
    return made


def widen_help_for_logs() -> None:
    """Typer renders --help with its own Rich console, at 80 columns without a terminal;
    TERMINAL_WIDTH, when set, is the user's choice and stays."""
    import sys

    from typer import rich_utils

    if not sys.stdout.isatty() and not os.environ.get("TERMINAL_WIDTH") and hasattr(rich_utils, "MAX_WIDTH"):
        rich_utils.MAX_WIDTH = HELP_LOG_WIDTH


console = make_console()  # results
err_console = make_console(stderr=True)  # progress and errors

F = TypeVar("F", bound=Callable[..., Any])


class OutputFormat(str, Enum):
    """How a command prints its tables; the names are reports.formats.FORMATS."""

    table = "table"
    csv = "csv"
    json = "json"


# Only for commands that read no trace: plan, trace and verify spend `--format` on the trace's
# format and print JSON with `--json`.
DEFAULT_MODEL = "llama-3.1-8b"
# --model for plan, capture and verify: one declaration, one default.
ModelOption = Annotated[str, typer.Option(
    help="Model preset (see `cgtool models`) or a Hugging Face folder with config.json.")]

# Shared by plan and schedule.
TpOpt = Annotated[int, typer.Option(
    "--tp", help="Tensor-parallel GPUs per server: memory and step time are per GPU.")]
EngineVersionOpt = Annotated[str | None, typer.Option(
    help="Engine release whose flags and defaults to use (default: the newest cgtool knows).")]

FORMAT_HELP = "Print the tables as rich tables, CSV blocks or JSON (see docs/formats.md)."
FormatOption = Annotated[OutputFormat, typer.Option("--format", help=FORMAT_HELP)]

EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2


def print_error(message: str) -> None:
    """The one error line: `error: what went wrong. What to do.` on stderr, never wrapped."""
    one_line = " ".join(message.split())
    err_console.print(f"[bold red]error:[/] {escape(one_line)}", highlight=False, soft_wrap=True)


def os_error_text(exc: OSError) -> str:
    where = f"{exc.filename}: " if exc.filename else ""
    return f"{where}{exc.strerror or exc}. Check the path and its permissions."


def cli_errors(func: F) -> F:
    """Turn a CgtoolError, or an OSError from reading or writing a file, into one line on
    stderr and exit code 2 (CGTOOL_DEBUG=1 re-raises)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (CgtoolError, OSError) as exc:
            if os.environ.get("CGTOOL_DEBUG"):
                raise
            print_error(os_error_text(exc) if isinstance(exc, OSError) else str(exc))
            raise typer.Exit(EXIT_BAD_INPUT) from None

    return wrapper  # type: ignore[return-value]


def check_out_folder(out: Path, flag: str = "--out") -> None:
    """Refuse, before any work (and before asking for a GPU), an output folder that cannot be
    made: a scratch folder is made and removed at once in the nearest existing folder above
    it, which also catches what os.access passes for root (a folder under /proc)."""
    existing = out
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(f"{flag} {out}: {existing} is a file, not a folder", "Pick a writable folder.")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".cgtool-probe-", dir=existing))
    except OSError as exc:
        raise InputError(
            f"{flag} {out}: cannot create the folder ({exc.strerror})", "Pick a writable folder."
        ) from None


def import_gpu_module(name: str, require_gpu: Callable[[], None]) -> ModuleType:
    """Import `name`, whose GPU kernels import Triton. torch's CUDA wheels bring Triton and its
    CPU wheels do not: there the answer is the missing GPU (`require_gpu` raises it), in one
    line, not a traceback."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name != "triton":
            raise
        require_gpu()
        raise EnvironmentProblem(
            "cgtool's GPU kernels need Triton, which is not installed",
            "pip install triton (torch's CUDA wheels bring it).",
        ) from None
