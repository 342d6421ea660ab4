#!/usr/bin/env bash
set -u
ts() { date +%H:%M:%S; }
for rep in 1 2 3 4 5 6; do for t in old new; do pp=$PWD; [[ $t == old ]] && pp=$PWD/scratch_diag/old
  echo "[$(ts)] $t $rep"; PYTHONPATH=$pp python3 scratch_diag/ab_step.py $t 2>>"$OUT/err.log" | tee -a "$OUT/eager-ab.jsonl"; done; done
echo "[$(ts)] done"
