"""Where an eager 8B bs-1 decode step's host time goes: the whole step, its recorded mm
calls replayed alone, its recorded Triton launches replayed alone (with and without the key)."""
import json, statistics, sys, time
import torch
from cgtool.capture.timing import plain_torch_host_us
from cgtool.capture.workbench import build_workbench
from cgtool.config import load_model_config
from cgtool.model import parallel
from cgtool.triton_launch import CachedKernel, _key
from cgtool.runners.pool import freeze_gc

cfg = load_model_config(sys.argv[1] if len(sys.argv) > 1 else "llama-3.1-8b")
bench = build_workbench(cfg, weights_dir=None, dtype=torch.bfloat16, mem_fraction_static=0.85,
                        max_bs=1, max_tokens=16, context_len=1024, seed=0)
batch = bench.decode_batch(1)
def step():
    hidden = bench.runner.forward_eager(batch)
    return bench.runner.model.compute_logits(hidden)
for _ in range(3): step()
torch.cuda.synchronize()

mms, launches = [], []
orig_linear, orig_launch = parallel.linear, CachedKernel.launch
def rec_linear(x, w, b=None):
    mms.append((x, w.t())); return orig_linear(x, w, b)
def rec_launch(self, grid, *args, **meta):
    launches.append((self, grid, args, meta)); return orig_launch(self, grid, *args, **meta)
parallel.linear = rec_linear; CachedKernel.launch = rec_launch
step(); torch.cuda.synchronize()
parallel.linear = orig_linear; CachedKernel.launch = orig_launch
print("mm", len(mms), "launches", len(launches))

def host(fn, reps=31):
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize(); t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    return statistics.median(ts) * 1e3

def mm_only():
    for x, wt in mms: torch.mm(x, wt)
def launch_only():
    for k, g, a, m in launches: k.launch(g, *a, **m)
bound = []
for k, g, a, m in launches:
    bound.append((k.compiled[_key(a, m)], g if len(g) == 3 else g + (1, 1, 1)[: 3 - len(g)], a))
def launcher_only():
    for l, g, a in bound: l(g, a)
def key_only():
    for k, g, a, m in launches: _key(a, m)
out = {}
with freeze_gc(enable_cudagraph_gc=False, collect=False):
    for rnd in range(3):
        for name, fn in [("step", step), ("mm_only", mm_only), ("launch_only", launch_only),
                         ("launcher_only", launcher_only), ("key_only", key_only)]:
            out.setdefault(name, []).append(host(fn))
out = {k: min(v) for k, v in out.items()}
out["plain_add_us"] = plain_torch_host_us()
# per-site breakdown of launches
from collections import Counter
print(Counter(k.fn.fn.__name__ for k, *_ in launches))
print(json.dumps(out, indent=1))
