"""Diagnostic: first profiler session cost in a fresh process; host profile of a decode measure loop."""
import cProfile, io, pstats, sys, time
import torch
from cgtool.capture.timing import profile_kernels_by_size

x = torch.ones(4096, device="cuda")
fn = lambda: x.add_(1)
fn(); torch.cuda.synchronize()
for label in ("first", "second"):
    pr = cProfile.Profile(); t0 = time.perf_counter(); pr.enable()
    r = profile_kernels_by_size([(1, fn)])
    pr.disable(); print(label, "profile session", round(time.perf_counter() - t0, 3), "s", r)
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(18); print(s.getvalue()[:4000])
# bare profiler enter/exit, third time
from torch.profiler import ProfilerActivity, profile
t0 = time.perf_counter()
with profile(activities=[ProfilerActivity.CUDA]) as p:
    fn(); torch.cuda.synchronize()
t1 = time.perf_counter(); ev = p.events(); t2 = time.perf_counter()
print("third: session", round(t1 - t0, 3), "events()", round(t2 - t1, 3))
