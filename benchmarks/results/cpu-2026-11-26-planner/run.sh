#!/usr/bin/env bash
# Runs the CPU planner benchmarks of this folder: one header per run (date,
# commit, host, load average before), /usr/bin/time around each run, the load average after.
#   benchmarks/results/cpu-2026-11-26-planner/run.sh heldout|million [RUNS] [CHECKOUT]
# Run from the repository root. CHECKOUT (default: this one) is another checkout, e.g. an older
# commit in a `git worktree add --detach`; its cgtool is put first on PYTHONPATH, so this
# checkout's .venv runs that commit's code and script.
set -euo pipefail
what=$1; runs=${2:-1}; checkout=${3:-$PWD}
python=$PWD/.venv/bin/python
cd "$checkout"
commit=$(git rev-parse --short HEAD)
dirty=$(git status --porcelain -- cgtool scripts | head -1)
host="Model name: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
loadavg() { uptime | sed 's/.*\(load average\)/\1/'; }
if [ "$what" = heldout ]; then args=(--heldout --load 1,2); else args=(); fi
for i in $(seq 1 "$runs"); do
  echo "# run $i: benchmarks/bench_plan.py ${args[*]}"
  echo "# date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  commit: $commit${dirty:+ (uncommitted changes)}"
  echo "# host: $host; before: $(loadavg)"
  PYTHONPATH=$checkout /usr/bin/time -f '# wall %e s, user %U s, sys %S s (all processes)' \
    "$python" benchmarks/bench_plan.py "${args[@]}" 2>&1
  echo "# after: $(loadavg)"
  echo
done
