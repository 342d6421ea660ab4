"""Provenance: the commit, command line, host CPU and versions, and "unknown" rather than failure."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import cgtool
from cgtool.documents.provenance import (
    COMMIT_ENV,
    UNKNOWN,
    collect_provenance,
    cpu_model,
    git_state,
)
from cgtool.documents.results import load_report

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs the git program")


def _git(cwd: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True,
                          env=env)
    return done.stdout.strip()


def _repo_with_package(root: Path, package_at: str) -> Path:
    """A git repository at `root` holding a committed `cgtool` folder at `package_at`."""
    package = root / package_at / "cgtool"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("x = 1\n")
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-qm", "first")
    return package


def test_command_line_and_versions_are_recorded():
    found = collect_provenance(["cgtool", "plan", "--trace", "t.jsonl"])
    assert found.command == ["cgtool", "plan", "--trace", "t.jsonl"]
    assert found.cgtool == cgtool.__version__
    assert found.torch.split("+")[0] == __import__("torch").__version__.split("+")[0]
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", found.python)


def test_host_cpu_is_named_and_counted():
    found = collect_provenance([])
    assert found.cpu_model == cpu_model() and found.cpu_model.strip()
    assert found.cpu_count == os.cpu_count()


@needs_git
def test_a_package_at_the_top_of_a_checkout_records_its_commit_and_whether_it_changed(tmp_path):
    package = _repo_with_package(tmp_path, ".")
    assert git_state(package) == (_git(tmp_path, "rev-parse", "HEAD"), False)
    (package / "__init__.py").write_text("x = 2\n")
    assert git_state(package) == (_git(tmp_path, "rev-parse", "HEAD"), True)


@needs_git
def test_an_installed_copy_inside_another_repository_does_not_borrow_its_commit(tmp_path):
    package = _repo_with_package(tmp_path, ".venv/lib/site-packages")
    assert git_state(package) == (UNKNOWN, None)


def test_outside_a_checkout_the_commit_is_unknown(tmp_path):
    package = tmp_path / "cgtool"
    package.mkdir()
    assert git_state(package) == (UNKNOWN, None)


def test_without_git_the_commit_is_unknown_or_the_launcher_supplied_one(tmp_path, monkeypatch):
    package = tmp_path / "cgtool"
    package.mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "no-programs-here"))
    monkeypatch.delenv(COMMIT_ENV, raising=False)
    assert git_state(package) == (UNKNOWN, None)
    monkeypatch.setenv(COMMIT_ENV, "0123abcd")
    assert git_state(package) == ("0123abcd", None)


@needs_git
def test_this_checkout_records_its_own_head():
    package = Path(cgtool.__file__).resolve().parent
    try:
        head = _git(package.parent, "rev-parse", "HEAD")
    except subprocess.CalledProcessError:
        pytest.skip("this copy of cgtool is not a git checkout")
    assert collect_provenance([]).commit == head


def test_a_capture_report_carries_the_provenance_of_the_capture(monkeypatch):
    import torch

    from cgtool.capture import session
    from cgtool.specs.config import load_model_config

    fixture = load_report(Path(__file__).parent / "data" / "reports" / "h100-llama-3.1-8b")
    monkeypatch.setattr(session, "environment", lambda: fixture.environment)  # no GPU to ask
    monkeypatch.setattr(sys, "argv", ["cgtool", "capture", "--model", "tiny"])
    opts = session.CaptureOptions(model="tiny", kinds=("decode",), capture_bs=[1],
                                  capture_num_tokens=[], dtype=torch.bfloat16)
    report = session.build_report(opts, load_model_config("tiny"), session.SessionState(),
                                  session.zero_totals())
    assert report.provenance == collect_provenance(["cgtool", "capture", "--model", "tiny"])
    assert report.to_dict()["provenance"]["command"] == ["cgtool", "capture", "--model", "tiny"]


def test_plan_json_records_the_command_line_that_made_it(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from cgtool.commands.main import app
    from cgtool.documents.results import load_plan

    trace = Path(__file__).parent.parent / "examples" / "azure-conv-first-1000.jsonl"
    argv = ["cgtool", "plan", "--trace", str(trace), "--gpu", "H100-80GB", "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv)  # what the console script would have been given
    result = CliRunner().invoke(app, argv[1:])
    assert result.exit_code == 0, result.output
    assert load_plan(tmp_path).provenance == collect_provenance(argv)


@needs_git
def test_the_launcher_supplied_commit_wins_over_a_copied_git_folder(monkeypatch):
    monkeypatch.setenv(COMMIT_ENV, "783de3d")
    assert git_state(Path(cgtool.__file__).resolve().parent) == ("783de3d", None)
