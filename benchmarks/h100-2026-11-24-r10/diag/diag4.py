"""Where the measure phase's time goes beyond the GPU's: stamps inside an instrumented check_replay."""
import json, sys, time
from pathlib import Path
import torch
from cgtool.capture import kinds, measure as M
from cgtool.capture.options import CaptureOptions, SessionState
from cgtool.capture.session import run_capture
from cgtool.capture.timing import CallTimer, hold_gpu, timed_call

stamps = []

def check_replay(eager, replay, dtype, pools=None, timed_eager=None, timed_replay=None, rel_ci=0.03, budget_ms=30.0):
    T = [("enter", time.perf_counter())]
    def s(name): T.append((name, time.perf_counter()))
    pools = pools if pools is not None else M.SpreadPools()
    timed_eager, timed_replay = timed_eager or eager, timed_replay or replay
    outputs, eager_first = timed_call(eager); s("eager")
    expected = M._copied(outputs); s("copy1")
    hold_gpu(); first = M.CallTimer(); got = M._copied(first.call(replay)); s("replay_issued")
    replay_first = first.ms(0); s("replay_synced")
    regime = M.regime_of(eager_first, replay_first)
    replay_pool, eager_pool = pools.pool("replay", regime), pools.pool("eager", regime)
    more_replays, more_eagers = M._agreed_most([
        replay_pool.samples_for(regime, replay_first, rel_ci, budget_ms, M.MOST_SAMPLES) - 1,
        eager_pool.samples_for(regime, eager_first, rel_ci, budget_ms, M.MOST_SAMPLES) - 1,
    ]); s("counts")
    replay_ms = [replay_first, *M._timed_calls(timed_replay, more_replays, held=True)]; s("more_replays")
    eager_ms = [eager_first, *M._timed_calls(timed_eager, more_eagers, held=False)]; s("more_eagers")
    replay_pool.add(replay_ms); eager_pool.add(eager_ms)
    diff, tolerance, output, row = M.compare_outputs(expected, got, dtype); s("compare")
    stamps.append(dict(T=T, eager=eager_ms, replay=replay_ms))
    return M.ReplayCheck(eager=M.PathTiming(tuple(eager_ms), regime, eager_pool),
        replay=M.PathTiming(tuple(replay_ms), regime, replay_pool), max_abs_diff=diff,
        tolerance=tolerance, worst_output=output, worst_token=row)

kinds.check_replay = check_replay
out = Path(sys.argv[1])
opts = CaptureOptions(model="llama-3.1-8b", kinds=("decode", "piecewise"), capture_bs=[1, 2, 4, *range(8, 257, 8)],
                      capture_num_tokens=[4, 8, 12, 16, 20, 24, 28, 32, *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64), *range(1280, 4097, 256)],
                      random_weights=True, out_dir=out / "cap")
state = SessionState()
t0 = time.perf_counter()
run_capture(opts, lambda e: stamps.append(dict(progress=e.phase, kind=e.kind, size=e.size, t=time.perf_counter())), state)
(out / "diag4.json").write_text(json.dumps(dict(stamps=stamps, phases=state.phase_s), indent=0))
print("done", state.phase_s)
