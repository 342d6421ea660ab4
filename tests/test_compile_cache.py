"""The compile cache on the CPU: a miss traces and stores, a hit runs the stored code without dynamo."""

import dataclasses
import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from test_piecewise import _mixed_batch, _model_runner

from cgtool.attention import make_backend
from cgtool.model.loader import build_model
from cgtool.runners import compile_cache
from cgtool.runners.piecewise import PiecewiseGraphRunner
from cgtool.runners.piecewise_backend import CapturablePiece, use_graphs_for
from cgtool.runtime.engine import ModelRunner
from cgtool.runtime.kv import KVPool
from cgtool.specs.config import load_model_config

SIZES = [8, 16, 64]


def _runner(model_runner, cache_dir):
    runner = PiecewiseGraphRunner(model_runner, capture_num_tokens=SIZES, compile_cache_dir=cache_dir)
    runner.warmup()
    return runner


@pytest.fixture(scope="module")
def model_runner():
    return _model_runner("cpu", torch.float32, "torch", max_context_len=512)


@pytest.fixture(scope="module")
def stored(model_runner, tmp_path_factory):
    """A runner that traced the body and wrote the entry, and the folder it wrote it in."""
    cache_dir = tmp_path_factory.mktemp("compile-cache")
    return _runner(model_runner, cache_dir), cache_dir


def _refuse(*args, **kwargs):
    raise AssertionError("torch.compile was called on a cache hit")


def test_a_miss_traces_once_and_writes_one_entry_under_its_key(stored):
    runner, cache_dir = stored
    assert runner.compile_cache == "miss"
    assert runner.backend.num_compiles == 1
    assert [p.name for p in cache_dir.iterdir()] == [f"{runner.cache_key}.json"]
    entry = json.loads((cache_dir / f"{runner.cache_key}.json").read_text())
    assert entry["key"] == runner.cache_key
    assert ["tokens"] in entry["inputs"] and ["arg", 0] in entry["inputs"] and ["arg", 1] in entry["inputs"]
    assert sum(p["capturable"] for p in entry["pieces"]) == len(runner.backend.pieces)


def test_a_hit_gives_the_compiled_outputs_without_calling_dynamo(stored, model_runner, monkeypatch):
    compiled, cache_dir = stored
    with monkeypatch.context() as patched:  # the compiled runner still recompiles for 1 token
        patched.setattr(torch, "compile", _refuse)
        hit = _runner(model_runner, cache_dir)
    assert hit.compile_cache == "hit"
    cfg = model_runner.model.cfg
    assert len(hit.backend.pieces) == cfg.num_layers + 1
    assert all(isinstance(p, CapturablePiece) for p in hit.backend.pieces)
    rng = random.Random(0)
    for num_tokens in (1, 2, 5, 16, 37, 64, 90):  # at, between and beyond the sizes
        batch = _mixed_batch(model_runner, num_tokens, rng)
        expected = compiled.forward_compiled(batch)
        torch.testing.assert_close(hit.forward_compiled(batch), expected, rtol=0, atol=0)
        torch.testing.assert_close(expected, model_runner.forward_eager(batch), rtol=1e-5, atol=1e-5)
    assert hit.backend.num_compiles == 0  # its backend never reached dynamo


def test_a_hit_runs_its_pieces_through_the_graph_wrappers(stored, model_runner):
    hit = _runner(model_runner, stored[1])
    batch = _mixed_batch(model_runner, 16, random.Random(1))
    with use_graphs_for(16), pytest.raises(RuntimeError, match="no CUDA graph for 16 tokens"):
        hit.forward_compiled(batch)


def test_a_hit_in_a_fresh_process_never_imports_dynamo(stored):
    script = textwrap.dedent(f"""
        import sys
        import torch
        from test_piecewise import _model_runner
        from cgtool.runners.piecewise import PiecewiseGraphRunner
        model_runner = _model_runner("cpu", torch.float32, "torch", max_context_len=512)
        runner = PiecewiseGraphRunner(model_runner, {SIZES}, compile_cache_dir=__import__("pathlib").Path(sys.argv[1]))
        runner.warmup()
        print(runner.compile_cache, "torch._dynamo" in sys.modules)
    """)
    tests = Path(__file__).parent
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", script, str(stored[1])], check=False, capture_output=True,
                          text=True, env=env, cwd=tests.parent, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["hit", "False"]


def _key(model, config_hash="c", compiler="eager", rank=0, size=1):
    return compile_cache.cache_key(model, config_hash, compiler, rank, size)


def test_the_key_changes_with_whatever_the_trace_depends_on(monkeypatch):
    cfg = load_model_config("tiny")
    body = build_model(cfg, device="cpu", dtype=torch.float32, max_positions=64).model
    base = _key(body)
    assert _key(build_model(cfg, device="cpu", dtype=torch.float32, max_positions=64).model) == base
    deeper = dataclasses.replace(cfg, num_layers=cfg.num_layers + 1)
    changed = [
        _key(body, config_hash="d"),
        _key(body, compiler="inductor"),
        _key(body, rank=1, size=2),
        _key(build_model(cfg, device="cpu", dtype=torch.bfloat16, max_positions=64).model),
        _key(build_model(deeper, device="cpu", dtype=torch.float32, max_positions=64).model),
    ]
    body.layers[0].some_flag = "torch"  # a plain attribute a forward may branch on
    changed.append(_key(body))
    del body.layers[0].some_flag
    monkeypatch.setattr(compile_cache, "cgtool_source_digest", lambda: "edited")
    changed.append(_key(body))
    assert base not in changed and len(set(changed)) == len(changed)


def test_a_changed_config_misses_and_keeps_both_entries(stored, tmp_path):
    good, cache_dir = stored
    shutil.copytree(cache_dir, tmp_path, dirs_exist_ok=True)
    cfg = load_model_config("tiny")
    cfg = dataclasses.replace(cfg, rms_norm_eps=cfg.rms_norm_eps * 10)  # same shapes, another trace
    model = build_model(cfg, device="cpu", dtype=torch.float32, max_positions=512)
    pool = KVPool(cfg, 4096, max_reqs=256, max_context_len=512, dtype=torch.float32, device="cpu")
    # In one process, a second model whose eps differs makes dynamo lift eps to a graph input
    # ("automatic dynamic"), a trace the cache refuses; a capture traces one model a process.
    torch._dynamo.reset()
    try:
        runner = _runner(ModelRunner(model, pool, make_backend("torch", cfg.num_heads, cfg.head_dim)), tmp_path)
    finally:
        torch._dynamo.reset()
    assert runner.compile_cache == "miss", runner.not_stored_reason
    assert runner.cache_key != good.cache_key
    assert sorted(p.stem for p in tmp_path.iterdir()) == sorted([good.cache_key, runner.cache_key])


@pytest.mark.parametrize("damage", ["truncated", "other key", "unknown parameter"])
def test_a_corrupt_or_mismatched_entry_is_ignored_then_rewritten(stored, model_runner, tmp_path, damage):
    good, cache_dir = stored
    text = (cache_dir / f"{good.cache_key}.json").read_text()
    entry = json.loads(text)
    if damage == "truncated":
        text = text[: len(text) // 2]
    elif damage == "other key":
        text = json.dumps(entry | {"key": "0" * 32})
    else:
        first_state = next(i for i, spec in enumerate(entry["inputs"]) if spec[0] == "state")
        entry["inputs"][first_state] = ["state", "no.such.weight"]
        text = json.dumps(entry)
    path = tmp_path / f"{good.cache_key}.json"
    path.write_text(text)
    runner = _runner(model_runner, tmp_path)
    assert runner.compile_cache == "miss", runner.not_stored_reason
    assert runner.backend.num_compiles == 1
    assert json.loads(path.read_text())["inputs"] == json.loads((cache_dir / path.name).read_text())["inputs"]
    assert _runner(model_runner, tmp_path).compile_cache == "hit"


def test_a_trace_that_cannot_be_written_runs_uncached(model_runner, tmp_path):
    blocked = tmp_path / "a file, not a folder"
    blocked.write_text("")
    runner = _runner(model_runner, blocked)
    assert runner.compile_cache == "not_stored" and runner.backend.num_compiles == 1
    batch = _mixed_batch(model_runner, 5, random.Random(2))
    torch.testing.assert_close(runner.forward_compiled(batch), model_runner.forward_eager(batch),
                               rtol=1e-5, atol=1e-5)


def test_no_cache_folder_means_the_cache_is_off(model_runner):
    runner = PiecewiseGraphRunner(model_runner, capture_num_tokens=SIZES)
    assert runner.compile_cache == "off"


def test_a_global_found_by_no_name_cannot_be_stored():
    assert compile_cache._global_ref(torch.nn.functional.silu) == ["attr", "torch.nn.functional", "silu"]
    with pytest.raises(compile_cache.UnsupportedTrace, match="cannot be imported by name"):
        compile_cache._global_ref(lambda x: x)


def test_the_cache_folder_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("CGTOOL_CACHE_DIR", str(tmp_path))
    assert compile_cache.default_cache_dir() == tmp_path
    monkeypatch.delenv("CGTOOL_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compile_cache.default_cache_dir() == tmp_path / "xdg" / "cgtool" / "compile"
