"""Where a report or plan came from: code commit, command line, host CPU, versions.

Every lookup degrades to "unknown" (or null) instead of failing: a capture must never be
lost because git is missing, the package was installed from a wheel, or /proc is absent.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

from cgtool import __version__
from cgtool.documents.document_io import Provenance

UNKNOWN = "unknown"
# Set by a launcher that copies the source (a GPU machine, CI): it wins over the copy's own
# .git, which may be stale (a GPU run of 2026-11-23 recorded the session's first commit).
COMMIT_ENV = "CGTOOL_GIT_COMMIT"
_PACKAGE_DIR = Path(__file__).resolve().parent.parent


def collect_provenance(argv: list[str] | None = None) -> Provenance:
    """This process's provenance; `argv` defaults to `sys.argv`, the exact command line."""
    commit, dirty = git_state(_PACKAGE_DIR)
    return Provenance(
        commit=commit,
        dirty=dirty,
        command=list(sys.argv if argv is None else argv),
        cpu_model=cpu_model(),
        cpu_count=os.cpu_count() or 0,
        cgtool=__version__,
        torch=_torch_version(),
        python=platform.python_version(),
    )


def git_state(package_dir: Path) -> tuple[str, bool | None]:
    """(commit, uncommitted changes?) of the checkout holding `package_dir`.

    Only a checkout whose top level holds this very package counts: an installed copy inside
    some unrelated repository (a virtualenv in a project folder) must not borrow its commit.
    """
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV], None
    top = _git(package_dir, "rev-parse", "--show-toplevel")
    commit = _git(package_dir, "rev-parse", "HEAD")
    if top is None or commit is None or Path(top).resolve() / package_dir.name != package_dir:
        return os.environ.get(COMMIT_ENV) or UNKNOWN, None
    status = _git(package_dir, "status", "--porcelain", "--untracked-files=no")
    return commit, None if status is None else bool(status)


def cpu_model() -> str:
    """The host CPU's marketing name (Linux /proc/cpuinfo), else what platform knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or UNKNOWN


def _git(cwd: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                              timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _torch_version() -> str:
    # The planner runs without importing torch; read its version without paying for the import.
    if "torch" in sys.modules:
        return str(sys.modules["torch"].__version__)
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("torch")
    except PackageNotFoundError:
        return UNKNOWN
