"""Out of memory and interruption during a real capture (GPU): what was measured is kept."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cgtool.capture.options import CaptureOptions, CaptureProgress, SessionState
from cgtool.capture.session import run_capture

pytestmark = pytest.mark.gpu
# Room left above what is reserved when the decode captures begin. The first warm-up's matmul
# on the capture stream takes that stream's cuBLAS workspace from it, 33 MiB kept for the
# session (H200, torch 2.11: benchmarks/diag_capture_oom.py); what is left must hold a small
# size's 20 MiB pool segment and not bs 256's 78 MB LM head output.
HEADROOM = 96 << 20


def _capture_under_cap(out_dir: str) -> dict:
    """The capture with the allocator capped at the decode captures' start, in a process of
    its own (see the test); what the test reads, as plain values."""
    opts = CaptureOptions(
        model="qwen2.5-0.5b", kinds=("decode",), capture_bs=[1, 2, 4, 8, 16, 256],
        capture_num_tokens=[], context_len=64, max_total_tokens=20_000, out_dir=Path(out_dir),
    )
    total = torch.cuda.mem_get_info()[1]

    def cap_memory_at_capture(event: CaptureProgress) -> None:
        if event.phase == "capture" and event.done == 0:
            torch.cuda.empty_cache()  # cached free blocks would otherwise count as headroom
            torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved() + HEADROOM) / total)
        if event.phase == "measure" and event.done == 0:
            torch.cuda.set_per_process_memory_fraction(1.0)  # eager timing needs its own room

    state = SessionState()
    report = run_capture(opts, cap_memory_at_capture, state)
    return {
        "status": {row.size: row.status for row in report.sizes},
        "diffs_of_ok": [row.max_abs_diff for row in report.sizes if row.status == "ok"],
        "report_status": report.status, "reason": report.incomplete_reason,
        "failed": None if state.failed is None else (state.failed.size, state.failed.shortfall_bytes),
    }


def test_sizes_that_do_not_fit_fail_and_the_smaller_ones_are_kept(tmp_path):
    """qwen2.5-0.5b's LM head output alone is 78 MB at bs 256 (151,936 × 256 bf16) but 0.3 MB
    at bs 1: with 96 MiB of headroom (63 once the cuBLAS workspace is taken) the largest sizes
    cannot be captured, the small ones can. In a process of its own: the capture that ran out of
    memory is kept alive, and a later breakable capture in the same process then tripped an
    internal assertion of PyTorch's pinned-memory allocator (H200, torch 2.11), as `cgtool
    capture` never does (each session is a process; prefill is captured before decode)."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        got = pool.apply(_capture_under_cap, (str(tmp_path),))
    status = got["status"]
    failed = sorted(size for size, s in status.items() if s == "failed")
    fitted = sorted(size for size, s in status.items() if s == "ok")
    assert status[256] == "failed" and status[1] == "ok", status
    assert max(fitted) < min(failed)  # a contiguous top block failed; every smaller size kept
    assert sorted(failed + fitted) == [1, 2, 4, 8, 16, 256]
    assert got["report_status"] == "incomplete"
    assert got["reason"].startswith("out of memory capturing decode size 256 (free ")
    assert got["failed"] is not None and got["failed"][0] == 256 and got["failed"][1] > 0
    assert all(diff is not None for diff in got["diffs_of_ok"])


def _capture_then_signal(out: Path, signum: int) -> tuple[int, str]:
    cmd = ["-m", "cgtool.commands.entry", "capture", "--model", "qwen2.5-0.5b",
           "--kind", "both", "--tokens", "16,32", "--max-bs", "256", "--context-len", "64",
           "--max-total-tokens", "40000", "--out", str(out)]
    proc = _start(cmd)
    seen = _read_until(proc, "capture decode:")  # piecewise is done and measured by then
    time.sleep(0.5)
    proc.send_signal(signum)
    output = seen + _finish(proc)  # before reading returncode, which is set once it has ended
    return proc.returncode, output


def _start(cmd: list[str]) -> subprocess.Popen[str]:
    # One pipe for both streams: reading stderr alone while the report tables filled the
    # stdout pipe left the child blocked on a write and the test blocked on a read.
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200")
    return subprocess.Popen([sys.executable, "-X", "faulthandler", *cmd], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)


def _read_until(proc: subprocess.Popen[str], text: str) -> str:
    seen = ""
    while text not in seen:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line, f"capture ended before {text!r}:\n{seen}"
        seen += line
    return seen


def _finish(proc: subprocess.Popen[str], timeout: float = 180) -> str:
    """The rest of the output; a child that does not stop dumps its threads' stacks first."""
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
        output = proc.communicate(timeout=30)[0]
        pytest.fail(f"the child did not stop within {timeout} s of the signal:\n{output[-6000:]}")


@pytest.mark.parametrize(("signum", "code", "name"), [(signal.SIGINT, 130, "SIGINT"), (signal.SIGTERM, 143, "SIGTERM")])
def test_a_signal_during_capture_writes_the_partial_report(tmp_path, signum, code, name):
    rc, output = _capture_then_signal(tmp_path / "run", signum)
    assert rc == code, output
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["status"] == "incomplete"
    assert report["incomplete_reason"].startswith(f"interrupted by {name} during ")
    kept = {(s["kind"], s["size"]) for s in report["sizes"]}
    assert {("piecewise", 16), ("piecewise", 32)} <= kept  # measured before the signal
    assert "Traceback" not in output


# Each phase line a profiled run prints (stderr is a pipe: one line per phase).
PHASE_LINES = ["compiling piecewise pieces", "measure piecewise:", "counting piecewise kernels",
               "capture decode:", "counting decode kernels"]


@pytest.mark.parametrize("line", PHASE_LINES)
def test_sigterm_in_any_phase_of_a_profiled_run_keeps_a_report(tmp_path, line):
    out = tmp_path / "run"
    proc = _start(["-m", "cgtool.commands.entry", "capture", "--model", "qwen2.5-0.5b",
                   "--bs", "1,2,4,8", "--tokens", "16,32,64,128", "--context-len", "128",
                   "--profile", "--out", str(out)])
    seen = _read_until(proc, line)
    proc.send_signal(signal.SIGTERM)
    output = seen + _finish(proc)
    assert proc.returncode == 143, output
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "incomplete"
    assert report["incomplete_reason"].startswith("interrupted by SIGTERM during "), report
    assert report["totals"]["phase_s"], "the phases run before the signal are kept"
    assert "Traceback" not in output
