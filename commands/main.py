"""The Typer app: one module per subcommand, registered here."""

from __future__ import annotations

from typing import Annotated

import typer

from cgtool import __version__
from cgtool.commands.capture import capture
from cgtool.commands.check import check
from cgtool.commands.common import widen_help_for_logs
from cgtool.commands.models import models
from cgtool.commands.plan import plan
from cgtool.commands.replay import replay
from cgtool.commands.report import report
from cgtool.commands.schedule import schedule
from cgtool.commands.trace import trace_app
from cgtool.commands.usage import CgtoolCommand, CgtoolGroup
from cgtool.commands.verify import verify

app = typer.Typer(
    name="cgtool",
    help="Plan and profile CUDA graph capture for LLM serving (SGLang, vLLM).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    cls=CgtoolGroup,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"cgtool {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool | None,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = None,
) -> None:
    """Plan and profile CUDA graph capture for LLM serving (SGLang, vLLM)."""


app.command("plan", cls=CgtoolCommand)(plan)
app.command("capture", cls=CgtoolCommand)(capture)
app.command("verify", cls=CgtoolCommand)(verify)
app.command("replay", cls=CgtoolCommand)(replay)
app.command("check", cls=CgtoolCommand)(check)
app.command("schedule", cls=CgtoolCommand)(schedule)
app.add_typer(trace_app, name="trace")
app.command("report", cls=CgtoolCommand)(report)
app.command("models", cls=CgtoolCommand)(models)


def main() -> None:
    widen_help_for_logs()
    app()  # Typer turns Ctrl-C outside the commands that keep partial results into exit 130


if __name__ == "__main__":
    main()
