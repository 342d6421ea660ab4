"""Versioned report.json and plan.json: typed results, one validating loader, atomic writes.

A capture report is built from the dataclasses below and written with `write_json_atomic`.
Reports and plans are read back through `load_document`, which checks schema, major version
and every field it needs, and raises one InputError naming the file and the field.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import types
import typing
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, Union

from cgtool.errors import InputError

REPORT_SCHEMA = "cgtool.report"
PLAN_SCHEMA = "cgtool.plan"
FORMAT_VERSION = "1.0"  # minor versions only add fields; a new major changes their meaning
REPORT_FILENAME = "report.json"
PLAN_FILENAME = "plan.json"

Kind = Literal["decode", "piecewise"]
SizeStatus = Literal["ok", "unsafe", "failed"]


def utc_now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(slots=True)
class Environment:
    gpu_name: str
    gpu_memory_bytes: int
    driver: str
    cuda: str
    torch: str
    cgtool: str
    hostname: str


@dataclass(slots=True)
class Provenance:
    """What produced a report or plan (cgtool.provenance collects it); its date is `created`."""

    commit: str  # git commit of the cgtool source, or "unknown" outside a git checkout
    dirty: bool | None  # tracked files changed since that commit; None when unknown
    command: list[str]  # the exact command line (sys.argv)
    cpu_model: str
    cpu_count: int  # logical CPUs of the host
    cgtool: str
    torch: str
    python: str


@dataclass(slots=True)
class ModelInfo:
    name: str
    architecture: str
    config_hash: str
    dtype: str
    param_bytes: int
    num_layers: int


@dataclass(slots=True)
class CaptureSettings:
    kinds: list[Kind]
    capture_bs: list[int]
    capture_num_tokens: list[int]
    compiler: Literal["eager", "inductor"]
    mem_fraction_static: float
    attention_backend: str
    context_len: int
    enable_cudagraph_gc: bool
    tp_size: int = 1


@dataclass(slots=True)
class SizeResult:
    """One captured graph: `size` is the batch size (decode) or token count (piecewise)."""

    kind: Kind
    size: int
    capture_s: float
    retained_bytes: int  # growth of the shared graph pool while capturing this size
    peak_bytes: int
    non_torch_bytes: int  # device used (mem_get_info) minus torch reserved: graph objects
    eager_ms: float | None  # None only when the size failed
    replay_ms: float | None
    speedup: float | None  # eager_ms / replay_ms
    kernels_per_forward: int
    max_abs_diff: float | None  # max |replay - eager| over the logits
    status: SizeStatus = "ok"
    roofline_ms: float | None = None
    rank: int = 0
    eager_ci95_ms: float | None = None  # half-width of the 95% confidence interval of eager_ms
    replay_ci95_ms: float | None = None
    max_diff_at: int | None = None  # token (piecewise) or request (decode) of max_abs_diff

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.kind, self.size, self.rank)


@dataclass(slots=True)
class CaptureTotals:
    weights_bytes: int
    kv_pool_bytes: int
    kv_tokens: int
    graph_pool_bytes: int
    peak_bytes: int
    free_before_capture_bytes: int
    free_after_capture_bytes: int
    capture_s: float
    non_torch_bytes: int
    copy_bandwidth_bytes_s: float | None = None
    # Seconds in each phase: load, compile, capture, measure, profile (render: the command's).
    phase_s: dict[str, float] = field(default_factory=dict)
    # SGLang's `mem usage` per kind: free memory before its capture minus after.
    sglang_mem_usage_bytes: dict[str, int] = field(default_factory=dict)
    eager_host_us_per_kernel: float | None = None  # smallest eager decode step
    static_buffer_bytes: int = 0  # the runners' static inputs and outputs, outside the pool
    other_torch_bytes: int = 0  # reserved growth outside pool and static buffers (workspaces)


@dataclass(slots=True)
class KernelRow:
    name: str
    cuda_ms: float
    launches: int


@dataclass(slots=True)
class Artifacts:
    """Paths relative to the report's folder; kernel tables keyed "kind:size"."""

    memory_snapshot: str | None = None  # the first of memory_snapshots
    chrome_trace: str | None = None  # the first of chrome_traces
    kernel_tables: dict[str, list[KernelRow]] = field(default_factory=dict)
    memory_snapshots: dict[str, str] = field(default_factory=dict)  # by kind
    chrome_traces: dict[str, str] = field(default_factory=dict)  # "kind:size" -> file


@dataclass(slots=True)
class CaptureReport:
    environment: Environment
    model: ModelInfo
    settings: CaptureSettings
    sizes: list[SizeResult]
    totals: CaptureTotals
    artifacts: Artifacts = field(default_factory=Artifacts)
    status: Literal["complete", "incomplete"] = "complete"
    incomplete_reason: str | None = None
    created: str = field(default_factory=utc_now_iso)
    # Tensor parallelism: every rank's totals in rank order (`totals` is rank 0's); empty at TP=1.
    rank_totals: list[CaptureTotals] = field(default_factory=list)
    provenance: Provenance | None = None  # None only in reports written before it existed

    def to_dict(self) -> dict[str, Any]:
        body = dataclasses.asdict(self)
        if not body["rank_totals"]:
            del body["rank_totals"]  # TP=1 reports stay as they were
        if body["provenance"] is None:
            del body["provenance"]
        head = {"schema": REPORT_SCHEMA, "version": FORMAT_VERSION}
        order = ("status", "incomplete_reason", "created", "provenance", "environment", "model",
                 "settings")
        return head | {k: body.pop(k) for k in order if k in body} | body

    @classmethod
    def from_dict(cls, data: Any, source: str = REPORT_FILENAME) -> CaptureReport:
        _check_header(data, REPORT_SCHEMA, source)
        report = _convert(cls, data, source, "")
        _check_created(report.created, source)
        _check_sizes(report.sizes, source)
        _check_ranks(report, source)
        return report

    def sizes_of(self, kind: str, rank: int = 0) -> list[SizeResult]:
        """This kind's sizes on one rank, largest first (the order they were captured in)."""
        rows = (s for s in self.sizes if s.kind == kind and s.rank == rank)
        return sorted(rows, key=lambda s: -s.size)

    def kinds(self) -> list[str]:
        return [k for k in ("decode", "piecewise") if any(s.kind == k for s in self.sizes)]


# The fields of plan.json that cgtool renders and compares; the planner may add more.
_HISTOGRAM = {"sizes": list[int], "counts": list[int], "time_s": list[float]}
_SCHEDULE_ROW = {"schedule": Literal["plan", "default"], "expected_step_ms": float,
                 "decode_coverage": float, "extend_coverage": float, "padding_waste": float,
                 "num_graphs": int, "graph_bytes": int, "capture_s": float, "kv_tokens": int}
PLAN_FIELDS: dict[str, Any] = {
    "status": Literal["complete", "incomplete"],
    "created": str,
    "inputs": {"trace": str, "model": str, "gpu": str, "engine": str},
    "decode": {"capture_bs": list[int], "max_bs": int, "histogram": _HISTOGRAM,
               "default_capture_bs": list[int]},
    "piecewise": {"capture_num_tokens": list[int], "max_tokens": int, "histogram": _HISTOGRAM,
                  "default_capture_num_tokens": list[int]},
    "memory": {"gpu_memory_bytes": int, "weights_bytes": int, "graph_bytes": int,
               "activation_bytes": int, "margin_bytes": int, "kv_bytes": int, "kv_tokens": int,
               "mem_fraction_static": float, "default_mem_fraction_static": float,
               "warnings": list[str]},
    "comparison": list[_SCHEDULE_ROW],  # type: ignore[valid-type]
    "flags": {"sglang": list[str]},
}


def validate_plan(data: Any, source: str = PLAN_FILENAME) -> dict[str, Any]:
    """Check a plan dict's header and the fields cgtool uses; return it unchanged."""
    _check_header(data, PLAN_SCHEMA, source)
    _convert(PLAN_FIELDS, data, source, "")
    if "provenance" in data:  # optional: plans written before it existed have none
        _convert(Provenance, data["provenance"], source, "provenance")
    return data


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


def write_report(report: CaptureReport, path: Path) -> None:
    write_json_atomic(path, report.to_dict())


def resolve_document(path: Path) -> Path:
    """A report.json/plan.json file, or a folder holding one of them."""
    path = Path(path)
    if path.is_dir():
        for name in (REPORT_FILENAME, PLAN_FILENAME):
            if (path / name).is_file():
                return path / name
        raise InputError(f"{path}: folder holds neither {REPORT_FILENAME} nor {PLAN_FILENAME}",
                         "Point at a capture or plan output folder.")
    if not path.is_file():
        raise InputError(f"{path}: no such file", "Check the path.")
    return path


def load_document(path: Path) -> CaptureReport | dict[str, Any]:
    """Load a report (as CaptureReport) or a plan (as a validated dict), by its schema field."""
    path = resolve_document(path)
    data = _read_json(path)
    if isinstance(data, dict) and data.get("schema") == PLAN_SCHEMA:
        return validate_plan(data, str(path))
    return CaptureReport.from_dict(data, str(path))


def load_report(path: Path) -> CaptureReport:
    document = load_document(path)
    if not isinstance(document, CaptureReport):
        raise InputError(f"{path}: is a plan, not a capture report", "Pass a report.json.")
    return document


def load_plan(path: Path) -> dict[str, Any]:
    document = load_document(path)
    if isinstance(document, CaptureReport):
        raise InputError(f"{path}: is a capture report, not a plan", "Pass a plan.json.")
    return document


def _read_json(path: Path) -> Any:
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


def _check_header(data: Any, schema: str, source: str) -> None:
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


def _check_created(created: str, source: str) -> None:
    try:
        datetime.fromisoformat(created)
    except ValueError:
        _fail(source, "created", f"is {_show(created)}, not an ISO-8601 time")


def _check_sizes(sizes: list[SizeResult], source: str) -> None:
    seen: set[tuple[str, int, int]] = set()
    for i, row in enumerate(sizes):
        where = f"sizes[{i}]"
        if row.size < 1:
            _fail(source, f"{where}.size", f"must be at least 1, got {row.size}")
        if row.key in seen:
            _fail(source, where, f"repeats {row.kind} size {row.size} rank {row.rank}")
        seen.add(row.key)
        for name in ("retained_bytes", "peak_bytes"):  # a pool's growth and a peak are >= 0
            if getattr(row, name) < 0:
                _fail(source, f"{where}.{name}", f"is {getattr(row, name)}, below 0 bytes")
        if row.status != "failed":
            for name in ("eager_ms", "replay_ms", "speedup"):
                if getattr(row, name) is None:
                    _fail(source, f"{where}.{name}", f"is null but status is '{row.status}'")


def _check_ranks(report: CaptureReport, source: str) -> None:
    tp_size = report.settings.tp_size
    if tp_size < 1:
        _fail(source, "settings.tp_size", f"must be at least 1, got {tp_size}")
    for i, row in enumerate(report.sizes):
        if not 0 <= row.rank < tp_size:
            _fail(source, f"sizes[{i}].rank", f"is {row.rank}, outside 0..{tp_size - 1} (tp_size)")
    if report.rank_totals and len(report.rank_totals) != tp_size:
        _fail(source, "rank_totals", f"has {len(report.rank_totals)} ranks, expected {tp_size}")


def _convert(expected: Any, value: Any, source: str, where: str) -> Any:
    """Check `value` against a type (dataclass, Literal, list, dict, scalar) or a dict spec."""
    if isinstance(expected, dict):
        return _convert_fields(expected, value, source, where, lambda **kw: kw)
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
        return _convert(inner[0], value, source, where)
    if origin is Literal:
        if value not in args or isinstance(value, bool):
            _fail(source, where, f"must be one of {', '.join(map(repr, args))}, got {_show(value)}")
        return value
    if origin is list:
        if not isinstance(value, list):
            _fail(source, where, f"must be a list, got {_kind(value)}")
        return [_convert(args[0], item, source, f"{where}[{i}]") for i, item in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            _fail(source, where, f"must be an object, got {_kind(value)}")
        return {k: _convert(args[1], v, source, f"{where}[{k!r}]") for k, v in value.items()}
    return _convert_scalar(expected, value, source, where)


def _convert_fields(spec: dict[str, Any], value: Any, source: str, where: str,
                    build: Any, optional: frozenset[str] | set[str] = frozenset()) -> Any:
    if not isinstance(value, dict):
        _fail(source, where or "top level", f"must be an object, got {_kind(value)}")
    kwargs = {}
    for name, expected in spec.items():
        path = f"{where}.{name}" if where else name
        if name not in value:
            if name in optional:
                continue
            _fail(source, path, "is missing")
        kwargs[name] = _convert(expected, value[name], source, path)
    return build(**kwargs)


def _convert_scalar(expected: type, value: Any, source: str, where: str) -> Any:
    if expected is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            _fail(source, where, f"must be a number, got {_kind(value)}")
        if not math.isfinite(float(value)):
            _fail(source, where, f"must be a finite number, got {value!r}")
        return float(value)
    if expected is int:
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(source, where, f"must be an integer, got {_kind(value)}")
        return value
    if not isinstance(value, expected):
        _fail(source, where, f"must be {_NAMES.get(expected, expected.__name__)}, got {_kind(value)}")
    return value


_NAMES = {str: "a string", bool: "true or false"}


def _fail(source: str, where: str, problem: str) -> typing.NoReturn:
    raise InputError(f"{source}: field '{where}' {problem}",
                     "Regenerate the file with cgtool, or fix that field.")


def _kind(value: Any) -> str:
    names = {type(None): "null", bool: "true/false", int: "an integer", float: "a number",
             str: "a string", list: "a list", dict: "an object"}
    return names.get(type(value), type(value).__name__)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
