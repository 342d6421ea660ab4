"""Host profile of a decode-only measure loop (qwen2.5-0.5b and llama-3.1-8b)."""
import cProfile, io, pstats, sys
from pathlib import Path
from cgtool.capture import kinds
from cgtool.capture.options import CaptureOptions, SessionState
from cgtool.capture.session import run_capture
orig = kinds._measure_decode
prof = cProfile.Profile()
def wrapped(*a, **k):
    prof.enable()
    try:
        return orig(*a, **k)
    finally:
        prof.disable()
kinds._measure_decode = wrapped
model = sys.argv[1]
opts = CaptureOptions(model=model, kinds=("decode",), capture_bs=[1, 2, 4, *range(8, 257, 8)], capture_num_tokens=[],
                      random_weights=True, out_dir=Path(sys.argv[2]), compile_cache=False)
state = SessionState()
run_capture(opts, lambda e: None, state)
print(model, state.phase_s)
for key in ("tottime", "cumulative"):
    s = io.StringIO(); pstats.Stats(prof, stream=s).sort_stats(key).print_stats(30); print(s.getvalue())
