"""Typer's usage errors and help, made cgtool's: one line per error, plain switches and names.

Typer prints a usage error as a boxed panel and exits 2; a CI log wants one line naming the
flag and the remedy, the way every other cgtool error reads. The group below runs Typer in
non-standalone mode and prints the errors itself. Help lists switches without a `<bool>`
metavar and arguments as `BASELINE`, not `{baseline}`.
"""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Sequence
from typing import Any

# Typer ships its own copy of Click; its parsing errors are these classes.
from typer._click.core import Command, Context, Parameter
from typer._click.exceptions import (
    BadParameter,
    ClickException,
    MissingParameter,
    NoArgsIsHelpError,
    NoSuchOption,
)
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption
from typer.exceptions import Abort

from cgtool.commands.common import EXIT_BAD_INPUT, print_error


def flag_name(param: Parameter) -> str:
    """The long option (`--budget-graphs`), or an argument's name in capitals (`BASELINE`)."""
    if isinstance(param, TyperOption):
        longs = [opt for opt in param.opts if opt.startswith("--")]
        return max(longs or param.opts, key=len)
    return (param.name or "").upper()


def _range_text(param: Parameter) -> str:
    low, high = getattr(param, "min", None), getattr(param, "max", None)
    bounds = ([f"≥ {low}"] if low is not None else []) + ([f"≤ {high}"] if high is not None else [])
    return " and ".join(bounds)


def given_value(args: Sequence[str], flag: str) -> str | None:
    """What the user wrote after `flag` (its last use), as `--flag VALUE` or `--flag=VALUE`."""
    for i in range(len(args) - 1, -1, -1):
        if args[i].startswith(flag + "="):
            return args[i][len(flag) + 1:]
        if args[i] == flag and i + 1 < len(args):
            return args[i + 1]
    return None


def _bad_value(error: BadParameter, args: Sequence[str]) -> str:
    param = error.param
    # Typer words its checks like pydantic ("Value error, 'x' is not one of ..."): keep the fact.
    message = error.message.removeprefix("Value error, ").rstrip(".")
    if param is None:
        return message
    name = flag_name(param)
    value = given_value(args, name) if isinstance(param, TyperOption) else None
    got = f" (got {value})" if value is not None else ""
    if _range_text(param) and ("should be greater" in message or "should be less" in message):
        return f"{name} must be {_range_text(param)}{got}"
    if "valid integer" in message:
        return f"{name} takes a whole number{got}"
    if "valid number" in message:
        return f"{name} takes a number{got}"
    return f"{name}: {message}"


def suggestions(unknown: str, known: Sequence[str]) -> list[str]:
    """Known options whose names resemble `unknown`, compared without the leading dashes so
    that every `--x` does not look alike."""
    names = {opt.lstrip("-"): opt for opt in known if opt.startswith("--")}
    close = difflib.get_close_matches(unknown.lstrip("-"), list(names), n=3, cutoff=0.6)
    return [names[name] for name in close]


def _no_such_option(error: NoSuchOption, command: Command) -> str:
    known = [opt for param in command.params for opt in param.opts]
    close = suggestions(error.option_name, known)
    text = f"unknown option {error.option_name}"
    return text + (f"; did you mean {' or '.join(close)}?" if close else "")


def command_of(root: Command, args: Sequence[str]) -> tuple[Command, str]:
    """The subcommand the arguments name, and its path (`cgtool trace convert`)."""
    command, path = root, [root.name or "cgtool"]
    for token in args:
        subcommands = getattr(command, "commands", {})
        if token in subcommands:
            command = subcommands[token]
            path.append(token)
    return command, " ".join(path)


def usage_error_line(error: ClickException, root: Command, args: Sequence[str]) -> str:
    """One sentence naming the flag, then where to look: `cgtool plan --help`."""
    command, path = command_of(root, args)
    message = error.format_message()
    needs_value = re.fullmatch(r"Option '(.+)' requires an argument\.?", message)
    no_command = re.fullmatch(r"No such command '(.*)'\.?", message)
    if isinstance(error, MissingParameter) and error.param is not None:
        what = "option" if isinstance(error.param, TyperOption) else "argument"
        text = f"missing {what} {flag_name(error.param)}"
    elif isinstance(error, BadParameter):
        text = _bad_value(error, args)
    elif isinstance(error, NoSuchOption):
        text = _no_such_option(error, command)
    elif needs_value:
        text = f"{needs_value[1]} needs a value"
    elif no_command:
        names = ", ".join(getattr(command, "commands", {}))
        text = f"unknown command '{no_command[1]}'; the commands are {names}"
    else:
        text = message.rstrip(".")
    return f"{text}{'' if text.endswith('?') else '.'} See `{path} --help`."


def _quiet_switches(params: list[Parameter]) -> list[Parameter]:
    # A switch takes no value: Typer would still show `<bool>` beside it.
    for param in params:
        if isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
            param.metavar = ""
    return params


def _usage_pieces(command: Command, ctx: Context) -> list[str]:
    pieces = [command.options_metavar] if command.options_metavar else []
    for param in command.get_params(ctx):
        if isinstance(param, TyperArgument):
            name = flag_name(param)
            pieces.append(name if param.required else f"[{name}]")
    return pieces


class CgtoolCommand(TyperCommand):
    def get_params(self, ctx: Context) -> list[Parameter]:
        return _quiet_switches(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: Context) -> list[str]:
        return _usage_pieces(self, ctx)


class CgtoolGroup(TyperGroup):
    def get_params(self, ctx: Context) -> list[Parameter]:
        return _quiet_switches(super().get_params(ctx))

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        given = list(sys.argv[1:] if args is None else args)
        try:
            code = super().main(given, prog_name, complete_var, standalone_mode=False, **extra)
        except NoArgsIsHelpError as asked:
            # `cgtool` or `cgtool trace` alone asks for the help, which Rich has printed
            # already (the error's own text is then empty: it printed "error: .").
            if asked.format_message().strip():
                print(asked.format_message())
            code = 0
        except ClickException as error:
            print_error(usage_error_line(error, self, given))
            code = EXIT_BAD_INPUT
        except Abort:
            print_error("aborted.")
            code = 1
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)
