#!/bin/bash
# Measure-phase breakdown: llama-3.1-8b --kind both, cold then twice from the compile cache.
set -u
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1
export CGTOOL_CACHE_DIR="$OUT/cc"; export PYTHONUNBUFFERED=1
for tag in ${RUNS:-cold hot1 hot2}; do
  echo "[$(date +%T)] $tag"
  s=$(date +%s.%N)
  python3 scratch_diag/measure_diag.py "$OUT/mdiag-$tag.json" -- capture --model llama-3.1-8b --kind both --out "$OUT/runs/$tag" >"$OUT/$tag.log" 2>&1
  echo "rc $? wall $(python3 -c "import time;print(round(time.time()-$s,1))")"
  grep measure-diag "$OUT/$tag.log"
  python3 -c "import json;r=json.load(open('$OUT/runs/$tag/report.json'));print(r['totals']['phase_s'])"
done
