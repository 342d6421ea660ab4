"""Where a capture session's measure phase goes: wall of each check_replay, its timed calls,
holds, and the loop around them. Usage: python measure_diag.py OUT.json -- cgtool args..."""
import atexit, json, sys, time
import torch
import cgtool.capture.kinds as kinds
import cgtool.capture.measure as measure
import cgtool.capture.per_size as per_size

out_path = sys.argv[1]
args = sys.argv[sys.argv.index("--") + 1:]
rec = {"checks": [], "holds": 0, "hold_s": 0.0, "warm_s": 0.0, "measured_s": []}

orig_check = measure.check_replay
def check(*a, **k):
    t = time.perf_counter(); r = orig_check(*a, **k); w = time.perf_counter() - t
    rec["checks"].append({"wall_s": w, "eager": list(r.eager.samples), "replay": list(r.replay.samples),
                          "regime": r.eager.regime})
    return r
kinds.check_replay = check
orig_hold = measure.hold_gpu
def hold():
    t = time.perf_counter(); orig_hold(); rec["holds"] += 1; rec["hold_s"] += time.perf_counter() - t
measure.hold_gpu = hold
orig_warm = kinds.warm_eager
def warm(f):
    torch.cuda.synchronize(); t = time.perf_counter(); orig_warm(f); torch.cuda.synchronize()
    rec["warm_s"] += time.perf_counter() - t
kinds.warm_eager = warm
orig_measured = kinds.measured
def measured(*a, **k):
    t = time.perf_counter(); r = orig_measured(*a, **k); rec["measured_s"].append(time.perf_counter() - t); return r
kinds.measured = measured

import cgtool.capture.workbench as wb
def timed(owner, name, key):
    orig = getattr(owner, name)
    def f(*a, **k):
        t = time.perf_counter(); r = orig(*a, **k); rec.setdefault(key, 0.0); rec[key] += time.perf_counter() - t; return r
    setattr(owner, name, f)
timed(kinds, "report_progress", "progress_s")
timed(kinds, "record_size", "record_s")
timed(wb.Workbench, "decode_batch", "decode_batch_s")
timed(wb.Workbench, "extend_batch", "extend_batch_s")
timed(measure, "compare_outputs", "compare_s")
timed(measure, "_copied", "copied_s")

def dump():
    c = rec["checks"]
    rec["summary"] = {
        "checks": len(c), "check_wall_s": sum(x["wall_s"] for x in c),
        "measured_wall_s": sum(rec["measured_s"]),
        "timed_s": sum(sum(x["eager"]) + sum(x["replay"]) for x in c) / 1e3,
        "floor_s": sum(x["eager"][0] + x["replay"][0] for x in c) / 1e3,
        "extra_calls": sum(len(x["eager"]) - 1 + len(x["replay"]) - 1 for x in c),
        "holds": rec["holds"], "hold_s": rec["hold_s"], "warm_s": rec["warm_s"],
        **{k: rec.get(k) for k in ("progress_s", "record_s", "decode_batch_s", "extend_batch_s", "compare_s", "copied_s")},
    }
    json.dump(rec, open(out_path, "w"))
    print("measure-diag", json.dumps(rec["summary"]), file=sys.stderr)
atexit.register(dump)

from cgtool.commands.entry import main
sys.argv = ["cgtool", *args]
main()
