"""One field of one trace record: checked, converted, or an error naming file, line and field."""

from __future__ import annotations

import gzip
import json
import math
import zlib
from pathlib import Path

from cgtool.errors import InputError

# req_to_token and the attention kernels index tokens with int32, and no model's
# context comes near it; anything larger is a corrupt record, not a long prompt.
MAX_TOKENS = 2**31 - 1
# A century of arrivals: larger values are unit mistakes (ns read as s) or corruption.
MAX_ARRIVAL_S = 100 * 365 * 86400.0


def where(source: str | Path, line_no: int) -> str:
    return f"{source}, line {line_no}"


def line_error(source: str | Path, line_no: int, problem: str, remedy: str) -> InputError:
    return InputError(f"{where(source, line_no)}: {problem}", remedy)


def field_error(
    source: str | Path, line_no: int, field: str, problem: str, remedy: str
) -> InputError:
    return InputError(f"{where(source, line_no)}, field '{field}': {problem}", remedy)


def show(value: object) -> str:
    """A bad value as the user would recognise it, cut short if huge."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def whole_number(
    value: object, source: str | Path, line_no: int, field: str, minimum: int, remedy: str
) -> int:
    """A JSON value that must be a count of tokens (or requests) of at least `minimum`."""
    # bool is an int subclass in Python; `true` is never a token count.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = "missing" if value is None else f"{show(value)}, not a number"
        raise field_error(source, line_no, field, f"is {kind}", remedy)
    if isinstance(value, float):
        if not (math.isfinite(value) and value.is_integer()):
            raise field_error(
                source, line_no, field, f"is {show(value)}, not a whole number", remedy
            )
        if value > MAX_TOKENS:  # say 1e+300, not its 301 digits
            raise field_error(
                source, line_no, field, f"is {value}, larger than {MAX_TOKENS}", remedy
            )
    return in_range(int(value), source, line_no, field, minimum, remedy)


def in_range(
    number: int, source: str | Path, line_no: int, field: str, minimum: int, remedy: str
) -> int:
    if number < minimum:
        bound = "zero or more" if minimum == 0 else f"at least {minimum}"
        raise field_error(source, line_no, field, f"is {number}, but must be {bound}", remedy)
    if number > MAX_TOKENS:
        raise field_error(
            source, line_no, field, f"is {show(number)}, larger than {MAX_TOKENS}", remedy
        )
    return number


def seconds(value: object, source: str | Path, line_no: int, field: str, remedy: str) -> float:
    """A JSON value that must be a time in seconds, zero or later."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = "missing" if value is None else f"{show(value)}, not a number"
        raise field_error(source, line_no, field, f"is {kind}", remedy)
    # int → float cannot overflow silently: huge ints fail the range check below first.
    if isinstance(value, int) and abs(value) > MAX_ARRIVAL_S:
        raise field_error(source, line_no, field, f"is {show(value)}, out of range", remedy)
    return time_in_range(float(value), source, line_no, field, remedy)


def time_in_range(
    value_s: float, source: str | Path, line_no: int, field: str, remedy: str
) -> float:
    if not math.isfinite(value_s):
        raise field_error(source, line_no, field, f"is {value_s}, not a finite time", remedy)
    if value_s < 0:
        raise field_error(source, line_no, field, f"is {value_s}, but must be zero or more", remedy)
    if value_s > MAX_ARRIVAL_S:
        raise field_error(source, line_no, field, f"is {value_s}, out of range", remedy)
    return value_s


def number_text(text: str, source: str | Path, line_no: int, field: str, remedy: str) -> float:
    """A CSV cell that must hold a number."""
    cleaned = text.strip()
    if not cleaned:
        raise field_error(source, line_no, field, "is empty", remedy)
    try:
        value = float(cleaned)
    except ValueError:
        raise field_error(
            source, line_no, field, f"is {show(cleaned)}, not a number", remedy
        ) from None
    if not math.isfinite(value):
        raise field_error(
            source, line_no, field, f"is {show(cleaned)}, not a finite number", remedy
        )
    return value


def whole_number_text(
    text: str, source: str | Path, line_no: int, field: str, minimum: int, remedy: str
) -> int:
    """A CSV cell that must hold a token count of at least `minimum`."""
    cleaned = text.strip()
    if cleaned.isascii() and cleaned.isdigit():  # the common case
        if len(cleaned) > 18:  # past int64, and int() refuses more than 4300 digits
            raise field_error(source, line_no, field, f"is {show(cleaned)}, far too large", remedy)
        return in_range(int(cleaned), source, line_no, field, minimum, remedy)
    value = number_text(cleaned, source, line_no, field, remedy)
    if not value.is_integer():
        raise field_error(source, line_no, field, f"is {show(cleaned)}, not a whole number", remedy)
    return in_range(int(value), source, line_no, field, minimum, remedy)


GZIP_MAGIC = b"\x1f\x8b"  # RFC 1952: public traces are often shipped gzipped


def a_or_an(word: str) -> str:
    """`word` with its article: "an Azure trace", "a cgtool trace"."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"


def read_lines(path: str | Path, what: str) -> list[str]:
    """A text file's lines (no line ends), gzipped or not, or one error naming the file and
    the bad line."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file", f"Pass the path of {a_or_an(what)}.") from None
    except IsADirectoryError:
        raise InputError(
            f"{path} is a folder, not a file", f"Pass the path of {a_or_an(what)}."
        ) from None
    except OSError as exc:
        raise InputError(
            f"{path} cannot be read ({exc.strerror})", "Check its permissions."
        ) from None
    if data.startswith(GZIP_MAGIC):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error):  # BadGzipFile is an OSError
            raise InputError(
                f"{path} is gzip-compressed but cut short or damaged", "Download it again."
            ) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line_no = data.count(b"\n", 0, exc.start) + 1
        raise line_error(
            path, line_no, "is not UTF-8 text",
            f"Is this really {a_or_an(what)}? Re-export it as UTF-8.",
        ) from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def json_object(text: str, source: str | Path, line_no: int, remedy: str) -> dict:
    """One JSON Lines line that must hold an object."""
    try:
        record = json.loads(text)
    except ValueError:  # JSONDecodeError, and ints past Python's digit limit
        raise line_error(source, line_no, "is not valid JSON", remedy) from None
    except RecursionError:
        raise line_error(source, line_no, "is JSON nested too deeply", remedy) from None
    if not isinstance(record, dict):
        raise line_error(source, line_no, "is not a JSON object", remedy)
    return record
