"""cgtool's compile cache: the traced, split decoder body kept as code and run again without dynamo.

With the `eager` piece compiler, compiling produces nothing but dynamo's trace of the body, split
at attention: a stitching graph and one FX graph per piece, all plain Python code. Most of the
`compile` phase is importing dynamo and tracing (seconds for 32 layers). An entry stores that
code, how each graph input is found again (a forward argument, the token count, or a parameter
or buffer by name) and the shape guards the trace made; a later run of the same model `exec`s
the code and calls the pieces directly, without torch.compile.

The key covers what the trace depends on: the model's config, its modules and their plain
attributes, every parameter's and buffer's name, shape, dtype and device type, the TP rank and
size, the piece compiler, the torch and Python versions and cgtool's own source. Any entry that
fails to load is a miss, and the miss writes it anew.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import linecache
import os
import sys
import tempfile
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, partial
from itertools import chain
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn

ENTRY_VERSION = 1
CACHE_DIR_ENV = "CGTOOL_CACHE_DIR"
_PLAIN = (bool, int, float, str, type(None))
# Plain attributes torch itself sets on modules: torch.compile marks the module it wraps.
_TORCH_OWNED = frozenset({"_is_torch_compile", "_is_full_backward_hook"})
# Token counts the stored shape guards are tried at: a guard true at all of them only says
# what every token count >= 2 satisfies (dynamo specialises 0 and 1).
_GUARD_PROBES = (2, 3, 17, 4096, 1 << 20)


class UnsupportedTrace(Exception):
    """The trace holds something an entry cannot name again: it is run, not stored."""


def default_cache_dir() -> Path:
    """`$CGTOOL_CACHE_DIR`, else `~/.cache/cgtool/compile` (under `$XDG_CACHE_HOME` when set)."""
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "cgtool" / "compile"


@cache
def cgtool_source_digest() -> str:
    """Any edit to cgtool's code may change what dynamo traces: it is part of every key."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _module_fingerprint(body: nn.Module) -> list[Any]:
    """Module types, their plain attributes (flags such as a MoE backend), and every tensor's
    name, shape, dtype and device type: what dynamo's guards on the module would check."""
    modules = []
    for name, module in body.named_modules(remove_duplicate=False):
        plain = {k: repr(v) for k, v in sorted(vars(module).items()) if k not in _TORCH_OWNED and (
            isinstance(v, _PLAIN) or (isinstance(v, tuple) and all(isinstance(x, _PLAIN) for x in v)))}
        modules.append([name, type(module).__module__, type(module).__qualname__, plain])
    tensors = [[name, list(t.shape), str(t.dtype), t.device.type, t.requires_grad]
               for name, t in chain(body.named_parameters(remove_duplicate=False),
                                    body.named_buffers(remove_duplicate=False))]
    return [modules, tensors]


def cache_key(body: nn.Module, config_hash: str, compiler: str, tp_rank: int, tp_size: int) -> str:
    parts = {
        "entry": ENTRY_VERSION,
        "config": config_hash,
        "compiler": compiler,
        "tp": [tp_rank, tp_size],
        "torch": torch.__version__,
        "python": list(sys.version_info[:3]),
        "cgtool": cgtool_source_digest(),
        "modules": _module_fingerprint(body),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def entry_path(cache_dir: Path, key: str) -> Path:
    return cache_dir / f"{key}.json"


# ---------------------------------------------------------------- storing a trace


def _global_ref(value: Any) -> list[str]:
    """How the code's global `value` is found again by name in another process."""
    if isinstance(value, types.ModuleType):
        return ["module", value.__name__]
    if isinstance(value, float):
        return ["float", repr(value)]  # FX names inf and nan as globals
    if value is type(None):
        return ["none_type"]
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str):
        ref = ["attr", module, qualname]
        try:
            if _resolve(ref) is value:
                return ref
        except (ImportError, AttributeError):
            pass  # e.g. a function defined inside another: no name reaches it
    raise UnsupportedTrace(f"the graph's global {value!r} cannot be imported by name")


def _resolve(ref: Sequence[str]) -> Any:
    kind = ref[0]
    if kind == "module":
        return importlib.import_module(ref[1])
    if kind == "float":
        return float(ref[1])
    if kind == "none_type":
        return type(None)
    if kind == "attr":
        value: Any = importlib.import_module(ref[1])
        for part in ref[2].split("."):
            value = getattr(value, part)
        return value
    raise ValueError(f"unknown global reference {ref!r}")


def _graph_code(graph: fx.GraphModule) -> dict[str, Any]:
    code = graph.graph.python_code(root_module="self")
    return {"src": code.src, "globals": {name: _global_ref(v) for name, v in code.globals.items()}}


def _shape_guards(gm: fx.GraphModule) -> list[str]:
    """The trace's symbolic shape guards, each checked to hold for any token count >= 2 when
    every symbol is that count: the only dynamic dimension is the token count."""
    fake_modes = (getattr(n.meta.get("example_value"), "fake_mode", None) for n in gm.graph.nodes
                  if n.op == "placeholder")
    shape_env = next((m.shape_env for m in fake_modes if m is not None), None)
    if shape_env is None:
        raise UnsupportedTrace("the trace's shape environment was not found")
    guards = []
    for guard in shape_env.guards:
        expr = guard.expr
        for n in _GUARD_PROBES:
            if not bool(expr.subs({symbol: n for symbol in expr.free_symbols})):
                raise UnsupportedTrace(f"shape guard {expr} does not hold for every token count")
        guards.append(str(expr))
    return guards


def _input_specs(placeholders: Sequence[str], example_inputs: Sequence[Any], body: nn.Module,
                 args: Sequence[torch.Tensor]) -> list[list[Any]]:
    """Each graph input as ["arg", i], ["tokens"] or ["state", name]: found by identity, which
    holds on every torch version, rather than by dynamo's source names, which change."""
    names = {id(t): name for name, t in chain(body.named_parameters(remove_duplicate=False),
                                             body.named_buffers(remove_duplicate=False))}
    arg_index = {id(t): i for i, t in enumerate(args)}
    num_tokens = args[0].shape[0]
    specs: list[list[Any]] = []
    for placeholder, value in zip(placeholders, example_inputs, strict=True):
        if isinstance(value, torch.SymInt):
            if not str(value).isidentifier() or getattr(value.node, "hint", None) != num_tokens:
                raise UnsupportedTrace(f"graph input {placeholder} is a symbol other than the token count")
            specs.append(["tokens"])
        elif isinstance(value, torch.Tensor) and id(value) in arg_index:
            specs.append(["arg", arg_index[id(value)]])
        elif isinstance(value, torch.Tensor) and id(value) in names:
            specs.append(["state", names[id(value)]])
        else:
            raise UnsupportedTrace(f"graph input {placeholder} ({type(value).__name__}) is no argument, "
                                   "parameter or buffer of the body")
    return specs


def _check_self_free(graph: fx.GraphModule, modules: Sequence[str] = ()) -> None:
    """Entries rebuild graphs as functions: a graph may read no attribute of its module but
    the pieces the stitching graph calls."""
    for node in graph.graph.nodes:
        if node.op == "get_attr" or (node.op == "call_module" and node.target not in modules):
            raise UnsupportedTrace(f"graph node {node.name} reads {node.target} from its module")


def build_entry(key: str, gm: fx.GraphModule, example_inputs: Sequence[Any], split: Any,
                body: nn.Module, args: Sequence[torch.Tensor], result: Any) -> dict[str, Any]:
    """The JSON entry for one trace: `gm` and `example_inputs` as dynamo handed them to the
    backend, `split` its SplitGraph (pieces already calling attention directly), `args` the
    forward's tensors and `result` what the compiled body returned for them."""
    outputs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    if not isinstance(result, torch.Tensor) or not isinstance(outputs, (tuple, list)) or len(outputs) != 1:
        raise UnsupportedTrace("the body returns something other than one tensor")
    _check_self_free(split.stitching, [p.name for p in split.pieces])
    for piece in split.pieces:
        _check_self_free(piece.graph)
    return {
        "version": ENTRY_VERSION,
        "key": key,
        "torch": torch.__version__,
        "inputs": _input_specs([n.name for n in gm.graph.nodes if n.op == "placeholder"],
                               example_inputs, body, args),
        "guards": _shape_guards(gm),
        "stitching": _graph_code(split.stitching),
        "pieces": [{"name": p.name, "capturable": p.capturable, "code": _graph_code(p.graph)}
                   for p in split.pieces],
    }


def write_entry(cache_dir: Path, entry: dict[str, Any]) -> Path:
    """Written whole or not at all: a run stopped mid-write leaves no half entry behind."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = entry_path(cache_dir, entry["key"])
    fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


# ---------------------------------------------------------------- running an entry


def _compile_code(code: dict[str, Any], filename: str) -> Callable[..., Any]:
    namespace = {name: _resolve(ref) for name, ref in code["globals"].items()}
    src = code["src"]
    # Registered so that a traceback through cached code shows its lines.
    linecache.cache[filename] = (len(src), None, src.splitlines(keepends=True), filename)
    # The code is FX's, written by cgtool into the user's own cache folder, as torch's own
    # GraphModule runs its generated code.
    exec(compile(src, filename, "exec"), namespace)  # noqa: S102
    return namespace["forward"]


class _Stitching:
    """The stitching graph's `forward(self, ...)`, with its pieces as `self.submod_<n>`."""

    def __init__(self, forward: Callable[..., Any]) -> None:
        self._forward = forward

    def __call__(self, *args: Any) -> Any:
        return self._forward(self, *args)


@dataclass(frozen=True)
class LoadedBody:
    """The stored body, called as torch.compile's wrapper is: forward args in, hidden states out."""

    stitching: _Stitching
    template: list[Any]  # the graph's inputs, parameters and buffers filled in
    arg_slots: list[tuple[int, int]]  # (graph input, forward argument)
    token_slots: list[int]
    capturable: list[Any]  # the capturable pieces' runnables, in call order

    def __call__(self, *args: torch.Tensor) -> torch.Tensor:
        inputs = list(self.template)
        for slot, index in self.arg_slots:
            inputs[slot] = args[index]
        num_tokens = args[0].shape[0]
        for slot in self.token_slots:
            inputs[slot] = num_tokens
        return self.stitching(*inputs)[0]


def load_body(cache_dir: Path, key: str, body: nn.Module,
              wrap_piece: Callable[[Callable[..., Any], int], Any]) -> LoadedBody:
    """The entry for `key` rebuilt over `body`'s tensors; `wrap_piece(runnable, index)` wraps
    each capturable piece (in a CapturablePiece). Raises on any missing or mismatched entry."""
    entry = json.loads(entry_path(cache_dir, key).read_text())
    if entry.get("version") != ENTRY_VERSION or entry.get("key") != key:
        raise ValueError("entry of another version or key")
    state = dict(chain(body.named_parameters(remove_duplicate=False), body.named_buffers(remove_duplicate=False)))
    template: list[Any] = []
    arg_slots: list[tuple[int, int]] = []
    token_slots: list[int] = []
    for slot, spec in enumerate(entry["inputs"]):
        template.append(state[spec[1]] if spec[0] == "state" else None)
        if spec[0] == "arg":
            arg_slots.append((slot, int(spec[1])))
        elif spec[0] == "tokens":
            token_slots.append(slot)
        elif spec[0] != "state":
            raise ValueError(f"unknown input {spec!r}")
    stitching = _Stitching(_compile_code(entry["stitching"], f"<cgtool compile cache {key} stitching>"))
    capturable: list[Any] = []
    for piece in entry["pieces"]:
        forward = _compile_code(piece["code"], f"<cgtool compile cache {key} {piece['name']}>")
        runnable = partial(forward, None)  # a piece's code never reads `self`
        if piece["capturable"]:
            runnable = wrap_piece(runnable, len(capturable))
            capturable.append(runnable)
        setattr(stitching, piece["name"], runnable)
    return LoadedBody(stitching, template, arg_slots, token_slots, capturable)


# ---------------------------------------------------------------- the runner's two calls


def try_load(cache_dir: Path, key: str, body: nn.Module,
             wrap_piece: Callable[[Callable[..., Any], int], Any]) -> LoadedBody | None:
    """The stored body, or None when there is no usable entry (absent, corrupt, stale)."""
    try:
        return load_body(cache_dir, key, body, wrap_piece)
    except Exception:  # noqa: BLE001 - any unusable entry is a miss; the miss rewrites it
        return None


def try_store(cache_dir: Path, key: str, backend: Any, body: nn.Module,
              args: Sequence[torch.Tensor], result: Any) -> str | None:
    """Store the backend's one compilation: None, or why it could not be (the run goes on
    uncached)."""
    if backend.num_compiles != 1 or backend.traced is None or backend.split is None:
        return f"{backend.num_compiles} compilations, not one"
    gm, example_inputs = backend.traced
    try:
        write_entry(cache_dir, build_entry(key, gm, example_inputs, backend.split, body, args, result))
    except Exception as error:  # noqa: BLE001 - an unsupported trace, a full disk, another torch's internals
        return f"{type(error).__name__}: {error}"
    return None
