"""One process: the eager llama-3.1-8b bs-1 decode step's median over 40 steps, and the host's
plain-add time, for an A/B of two trees run alternately (PYTHONPATH picks the tree)."""
import json, statistics, sys, time
import torch
import cgtool
from cgtool.capture.timing import plain_torch_host_us, kernels_per_call, profile_kernels_by_size
from cgtool.capture.workbench import build_workbench
from cgtool.config import load_model_config
from cgtool.runners.pool import freeze_gc

cfg = load_model_config("llama-3.1-8b")
bench = build_workbench(cfg, weights_dir=None, dtype=torch.bfloat16, mem_fraction_static=0.85,
                        max_bs=1, max_tokens=16, context_len=1024, seed=0)
batch = bench.decode_batch(1)
def step():
    return bench.runner.model.compute_logits(bench.runner.forward_eager(batch))
for _ in range(5): step()
torch.cuda.synchronize()
plain_before = plain_torch_host_us()
times = []
with freeze_gc(enable_cudagraph_gc=False, collect=False):
    for _ in range(80):
        torch.cuda.synchronize(); t = time.perf_counter(); step(); torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
plain_after = plain_torch_host_us()
logits = step().float()
kernels = kernels_per_call(profile_kernels_by_size([(0, step)])[0])
print(json.dumps({"tree": sys.argv[1], "cgtool": cgtool.__file__, "step_ms": statistics.median(times), "step_ms_p20": sorted(times)[len(times) // 5],
                  "plain_add_us": (plain_before + plain_after) / 2, "kernels": kernels,
                  "logits_sum": float(logits.sum()), "logits_absmax": float(logits.abs().max())}))
