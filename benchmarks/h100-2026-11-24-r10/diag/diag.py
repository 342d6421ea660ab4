"""Diagnostic: why eager steps in a session read 2x the bench (allocator? host?)."""
import json, sys, time
from pathlib import Path
import torch
from cgtool.capture import kinds
from cgtool.capture.options import CaptureOptions, SessionState
from cgtool.capture.session import run_capture
from cgtool.runners.sizes import capture_sizes

KEYS = ["num_alloc_retries", "num_device_alloc", "num_device_free", "num_sync_all_streams",
        "allocation.all.allocated", "segment.all.allocated", "segment.all.freed"]
log = []
orig = kinds.check_replay
current = {}

def wrap(fn, tag):
    def counted():
        s0 = torch.cuda.memory_stats()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        r = fn()
        host = time.perf_counter() - t0
        torch.cuda.synchronize()
        total = time.perf_counter() - t0
        s1 = torch.cuda.memory_stats()
        log.append(dict(tag=tag, t=time.perf_counter(), host_ms=host * 1e3, total_ms=total * 1e3,
                        **{k: s1.get(k, 0) - s0.get(k, 0) for k in KEYS}))
        return r
    return counted

def wrapped(eager, replay, dtype, pools=None, timed_eager=None, timed_replay=None, **kw):
    log.append(dict(tag="size", free=torch.cuda.mem_get_info()[0], reserved=torch.cuda.memory_reserved()))
    return orig(eager=wrap(eager, "eager"), replay=replay, dtype=dtype, pools=pools,
                timed_eager=wrap(timed_eager or eager, "eager_timed"), timed_replay=timed_replay, **kw)

kinds.check_replay = wrapped
out = Path(sys.argv[1])
kind = tuple(sys.argv[2].split(","))
opts = CaptureOptions(model="llama-3.1-8b", kinds=kind, capture_bs=[1, 2, 4, *range(8, 257, 8)],
                      capture_num_tokens=[4, 8, 12, 16, 20, 24, 28, 32, *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64), *range(1280, 4097, 256)],
                      random_weights=True, out_dir=out / "cap", compile_cache=False)
state = SessionState()
report = run_capture(opts, lambda e: None, state)
for s in report.sizes:
    log.append(dict(tag="row", kind=s.kind, size=s.size, eager=s.eager_ms, replay=s.replay_ms))
log.append(dict(tag="phases", **state.phase_s))
(out / f"diag-{'-'.join(kind)}.json").write_text(json.dumps(log, indent=1))
print("done", kind, state.phase_s)
