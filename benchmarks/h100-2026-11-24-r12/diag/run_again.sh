#!/bin/bash
# The llama-3.1-8b --kind both session: one first run, then four from the compile cache.
set -u
OUT=${OUT:-gpu-out}; mkdir -p "$OUT/runs"
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1
export CGTOOL_CACHE_DIR="$OUT/cc"; export PYTHONUNBUFFERED=1
walls=()
for tag in first again1 again2 again3 again4; do
  name="llama-3.1-8b-$tag"; echo "[$(date +%T)] $name"
  s=$(date +%s.%N)
  cgtool capture --model llama-3.1-8b --kind both --out "$OUT/runs/$name" >"$OUT/runs/$name.log" 2>&1
  wall=$(python3 -c "import time; print(round(time.time() - $s, 1))"); echo "rc $? wall $wall"
  walls+=("$OUT/runs/$name=$wall")
done
python3 scripts/bench_phases.py "${walls[@]}" | tee "$OUT/phases.txt"
rm -rf "$OUT/cc" "$OUT"/runs/*/figures "$OUT"/runs/*/report.html
tar czf "$OUT/results.tgz" -C "$OUT" runs && rm -rf "$OUT/runs"
