#!/usr/bin/env bash
# r11: attention GPU time and the eager step, old tree (4bdb78a) against this tree in
# alternating processes; the changed files' tests; then the speed stage.
set -u
ts() { date +%H:%M:%S; }
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1
mkdir -p "$OUT/ab"
for rep in 1 2; do for t in old new; do pp=$PWD; [[ $t == old ]] && pp=$PWD/scratch_diag/old
  echo "[$(ts)] attention $t $rep"; PYTHONPATH=$pp python3 scratch_diag/attn_gpu_ab.py $t 2>>"$OUT/ab/err.log" | tee -a "$OUT/ab/attention.txt"; done; done
for rep in 1 2 3; do for t in old new; do pp=$PWD; [[ $t == old ]] && pp=$PWD/scratch_diag/old
  echo "[$(ts)] eager step $t $rep"; PYTHONPATH=$pp python3 scratch_diag/ab_step.py $t 2>>"$OUT/ab/err.log" | tee -a "$OUT/ab/eager.jsonl"; done; done
echo "[$(ts)] tests"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_triton_decode.py tests/test_decode_runner.py tests/test_triton_mla.py tests/test_graphs.py tests/test_fused.py tests/test_model.py 2>&1 | tee "$OUT/tests.log" | tail -4
echo "[$(ts)] speed"
scripts/gpu-check.sh speed 2>&1 | grep -E "^\[|exit|^run|^speed" | tail -30
echo "[$(ts)] done"
