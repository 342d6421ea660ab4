"""Reading, checking and writing cgtool's JSON documents (report.json, plan.json, verify.json).

One validating converter turns parsed JSON into the documents' dataclasses, checking every
field against its type, and every failure is one InputError naming the file and the field.
Writes are atomic. The document types themselves live in cgtool.documents.results (capture reports),
cgtool.documents.plan_document (plans) and cgtool.verify.result (verifications).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import types
import typing
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, Union

from cgtool.errors import InputError, shown_integer

FORMAT_VERSION = "1.0"  # minor versions only add fields; a new major changes their meaning
_LARGEST_FLOAT = sys.float_info.max
_LARGEST_INT = 2**53


def utc_now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(slots=True)
class Provenance:
    """What produced a report or plan (cgtool.documents.provenance collects it); its date is `created`."""

    commit: str  # git commit of the cgtool source, or "unknown" outside a git checkout
    dirty: bool | None  # tracked files changed since that commit; None when unknown
    command: list[str]  # the exact command line (sys.argv)
    cpu_model: str
    cpu_count: int  # logical CPUs of the host
    cgtool: str
    torch: str
    python: str


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON so that a reader sees the old file or the whole new one, never half."""
    path = Path(path)
    text = json.dumps(data, indent=2, allow_nan=False) + "\n"
    # Opened by name with mode 0666, so the file gets the user's umask (mkstemp would give 0600).
    tmp_name = str(path.with_name(f".{path.name}.{os.getpid()}.tmp"))
    fd = os.open(tmp_name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as tmp:
            tmp.write(text)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    # The rename itself is durable only once the folder's entry is flushed (POSIX).
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_json(path: Path) -> Any:
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror})", "Check the path.") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte {exc.start})",
                         "Regenerate the file; it is not a cgtool report or plan.") from None
    if not text.strip():
        raise InputError(f"{path}: file is empty", "Regenerate it; the run may have been cut off.")
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{path}: not valid JSON at line {exc.lineno} column {exc.colno} ({exc.msg})",
            "The file is truncated or corrupt; regenerate it.",
        ) from None
    except (RecursionError, ValueError) as exc:
        raise InputError(f"{path}: not valid JSON ({exc})", "Regenerate the file.") from None


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def check_header(data: Any, schema: str, source: str) -> None:
    if not isinstance(data, dict):
        raise InputError(f"{source}: expected a JSON object at the top, got {_kind(data)}",
                         "Pass a cgtool report.json or plan.json.")
    if data.get("schema") != schema:
        raise InputError(f"{source}: field 'schema' is {_show(data.get('schema'))}, "
                         f"expected '{schema}'", "Pass a file cgtool wrote.")
    version = data.get("version")
    major = version.split(".")[0] if isinstance(version, str) else None
    if major is None or not major.isdigit():
        raise InputError(f"{source}: field 'version' is {_show(version)}, expected "
                         f"'MAJOR.MINOR' such as '{FORMAT_VERSION}'", "Regenerate the file.")
    if major != FORMAT_VERSION.split(".")[0]:
        raise InputError(f"{source}: version {version} has unknown major version {major}; "
                         f"this cgtool reads {FORMAT_VERSION.split('.')[0]}.x",
                         "Use the cgtool version that wrote it, or regenerate it.")


def check_created(created: str, source: str) -> None:
    try:
        datetime.fromisoformat(created)
    except ValueError:
        fail(source, "created", f"is {_show(created)}, not an ISO-8601 time")


def convert(expected: Any, value: Any, source: str, where: str) -> Any:
    """Check `value` against a type (dataclass, Literal, list, dict, scalar) and build it."""
    if dataclasses.is_dataclass(expected):
        hints = typing.get_type_hints(expected)
        spec = {f.name: hints[f.name] for f in dataclasses.fields(expected)}
        optional = {f.name for f in dataclasses.fields(expected)
                    if f.default is not dataclasses.MISSING
                    or f.default_factory is not dataclasses.MISSING}
        return _convert_fields(spec, value, source, where, expected, optional)
    origin, args = typing.get_origin(expected), typing.get_args(expected)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return convert(inner[0], value, source, where)
    if origin is Literal:
        if value not in args or isinstance(value, bool):
            fail(source, where, f"must be one of {', '.join(map(repr, args))}, got {_show(value)}")
        return value
    if origin is list:
        if not isinstance(value, list):
            fail(source, where, f"must be a list, got {_kind(value)}")
        return [convert(args[0], item, source, f"{where}[{i}]") for i, item in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            fail(source, where, f"must be an object, got {_kind(value)}")
        return {k: convert(args[1], v, source, f"{where}[{k!r}]") for k, v in value.items()}
    return _convert_scalar(expected, value, source, where)


def _convert_fields(spec: dict[str, Any], value: Any, source: str, where: str,
                    build: Any, optional: set[str]) -> Any:
    if not isinstance(value, dict):
        fail(source, where or "top level", f"must be an object, got {_kind(value)}")
    kwargs = {}
    for name, expected in spec.items():
        path = f"{where}.{name}" if where else name
        if name not in value:
            if name in optional:
                continue
            fail(source, path, "is missing")
        kwargs[name] = convert(expected, value[name], source, path)
    return build(**kwargs)


def _convert_scalar(expected: type, value: Any, source: str, where: str) -> Any:
    if expected is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            fail(source, where, f"must be a number, got {_kind(value)}")
        # An integer of hundreds of digits (JSON has no bound) is past what float() takes.
        if isinstance(value, int) and abs(value) > _LARGEST_FLOAT:
            fail(source, where, f"must be a finite number, got {shown_integer(value)}")
        if not math.isfinite(float(value)):
            fail(source, where, f"must be a finite number, got {value!r}")
        return float(value)
    if expected is int:
        if isinstance(value, bool) or not isinstance(value, int):
            fail(source, where, f"must be an integer, got {_kind(value)}")
        # Every count and byte total here is far below 2**53; past 64 bits numpy and float()
        # fail on a value, and past 2**53 a float no longer holds it exactly.
        if abs(value) > _LARGEST_INT:
            fail(source, where, f"must be at most {_LARGEST_INT:,} in size, got {shown_integer(value)}")
        return value
    if not isinstance(value, expected):
        fail(source, where, f"must be {_NAMES.get(expected, expected.__name__)}, got {_kind(value)}")
    return value


_NAMES = {str: "a string", bool: "true or false"}


def fail(source: str, where: str, problem: str) -> typing.NoReturn:
    raise InputError(f"{source}: field '{where}' {problem}",
                     "Regenerate the file with cgtool, or fix that field.")


def _kind(value: Any) -> str:
    names = {type(None): "null", bool: "true/false", int: "an integer", float: "a number",
             str: "a string", list: "a list", dict: "an object"}
    return names.get(type(value), type(value).__name__)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
