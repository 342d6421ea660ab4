"""Why every decode size fails under test_capture_reliability's 48 MiB headroom (GPU).

    python3 benchmarks/diag_capture_oom.py [--headroom-mib 48 96 192]

Runs the test's capture (qwen2.5-0.5b decode, bs 1 2 4 8 16 256, 64-token context) with the
allocator capped at what is reserved when the captures begin plus the headroom, and prints at
each progress event the allocator's reserved and allocated bytes, then each size's status and
the session's reason and failure record.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from cgtool.capture.options import CaptureOptions, CaptureProgress, SessionState
from cgtool.capture.session import run_capture

MIB = 1 << 20


def one(headroom: int, history: bool = False) -> None:
    total = torch.cuda.mem_get_info()[1]
    with tempfile.TemporaryDirectory() as out:
        opts = CaptureOptions(model="qwen2.5-0.5b", kinds=("decode",), capture_bs=[1, 2, 4, 8, 16, 256],
                              capture_num_tokens=[], context_len=64, max_total_tokens=20_000,
                              out_dir=Path(out))

        def event(e: CaptureProgress) -> None:
            if e.phase == "capture" and e.done == 1 and history:
                _blocks_since_capture()
            if e.phase == "capture" and e.done == 0:
                if history:
                    torch.cuda.memory._record_memory_history(max_entries=200_000)
                torch.cuda.empty_cache()
                torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved() + headroom) / total)
            if e.phase == "measure" and e.done == 0:
                torch.cuda.set_per_process_memory_fraction(1.0)
            print(f"  {e.phase:10s} size {e.size} {e.done}/{e.total}: reserved "
                  f"{torch.cuda.memory_reserved() / MIB:8.1f} MiB, allocated "
                  f"{torch.cuda.memory_allocated() / MIB:8.1f} MiB", flush=True)

        state = SessionState()
        try:
            report = run_capture(opts, event, state)
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0)
        print(f"headroom {headroom / MIB:.0f} MiB: status {report.status}; reason {report.incomplete_reason}")
        print(f"  failed record: {state.failed}")
        _live_memory()
        for row in report.sizes:
            print(f"  {row.kind} {row.size}: {row.status} retained {row.retained_bytes / MIB:.1f} MiB "
                  f"peak {row.peak_bytes / MIB:.1f} MiB")


def _blocks_since_capture() -> None:
    """Blocks still allocated that the largest size's attempt took, with where they came from."""
    import gc
    from collections import Counter

    gc.collect()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    where: Counter = Counter()
    for seg in snap["segments"]:
        for block in seg["blocks"]:
            frames = block.get("frames") or []
            if block["state"] != "active_allocated" or not frames:
                continue
            ours = [f"{Path(f['filename']).name}:{f['line']} {f['name']}" for f in frames
                    if "cgtool" in f["filename"] or "benchmarks" in f["filename"]][:4]
            where[" < ".join(ours) or frames[0]["name"]] += block["size"]
    print("  still allocated from the failed attempt (bytes by origin):")
    for origin, size in where.most_common(12):
        print(f"    {size / MIB:7.2f} MiB  {origin}")


def _live_memory() -> None:
    """Where the allocated bytes are: active blocks per pool, and CUDA tensors Python holds."""
    import gc
    from collections import Counter

    gc.collect()
    pools: Counter = Counter()
    for seg in torch.cuda.memory_snapshot():
        active = sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated")
        pools[str(seg.get("segment_pool_id"))] += active
    print("  active bytes per pool: " + ", ".join(f"{k}: {v / MIB:.1f} MiB" for k, v in pools.items()))
    sizes: Counter = Counter()
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.is_cuda and obj.untyped_storage().nbytes() >= MIB:
            sizes[(tuple(obj.shape), str(obj.dtype))] += 1
    big = sorted(sizes.items(), key=lambda kv: -kv[1])[:25]
    print("  CUDA tensors of 1 MiB or more Python holds (shape, dtype: count): " + "; ".join(
        f"{k}: {v}" for k, v in big))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--headroom-mib", type=int, nargs="+", default=[48, 96, 192])
    parser.add_argument("--history", action="store_true",
                        help="record allocations from the first capture; print what the failed one left")
    args = parser.parse_args()
    for mib in args.headroom_mib:
        one(mib * MIB, args.history)


if __name__ == "__main__":
    main()
