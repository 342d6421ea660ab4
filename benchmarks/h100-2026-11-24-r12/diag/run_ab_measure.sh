#!/bin/bash
# Measure phase, old tree (8dd1623) against the working tree: llama-3.1-8b --kind both, each
# tree's compile cache warmed once, then cache-hit runs in alternating processes.
set -u
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1
export PYTHONUNBUFFERED=1
one() {  # tree tag
  local pp=""; [[ $1 == old ]] && pp=$PWD/scratch_diag/old
  echo "[$(date +%T)] $1 $2"
  local s=$(date +%s.%N)
  CGTOOL_CACHE_DIR="$OUT/cc-$1" PYTHONPATH=$pp python3 scratch_diag/measure_diag.py "$OUT/mdiag-$1-$2.json" -- \
    capture --model llama-3.1-8b --kind both --out "$OUT/runs/$1-$2" >"$OUT/$1-$2.log" 2>&1
  echo "rc $? wall $(python3 -c "import time;print(round(time.time()-$s,1))")"
  grep measure-diag "$OUT/$1-$2.log" | cut -c1-400
  python3 -c "import json;r=json.load(open('$OUT/runs/$1-$2/report.json'));p=r['totals']['phase_s'];print({k:round(v,2) for k,v in p.items()}, 'measure/wall-ish', round(p['measure']/sum(p.values()),3))"
  python3 - "$OUT/runs/$1-$2/report.json" >>"$OUT/rows.txt" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(sys.argv[1], json.dumps(r["totals"]["sample_spread"]))
print(sys.argv[1], [(s["kind"], s["size"], s["eager_samples"], s["replay_samples"], s["status"]) for s in r["sizes"]])
PY
}
one old cold; one new cold
for rep in 1 2 3; do one new hot$rep; one old hot$rep; done
rm -rf "$OUT"/cc-* "$OUT"/runs/*/figures
echo "[$(date +%T)] tests"
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_kinds.py tests/test_measure.py tests/test_sampling.py 2>&1 | tail -8
echo "[$(date +%T)] done"
