#!/usr/bin/env bash
# Writes docs/ci-log.md: what capture's tables, plan and check print when stdout is not a
# terminal (a CI log), stdout and stderr together as a CI runner records them.
set -u
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
doc=docs/ci-log.md

run() {
  echo '```console'
  echo "\$ cgtool $*" | sed "s#$out#ci-out#g"
  cgtool "$@" 2>&1 | cat | sed -e "s#$out#ci-out#g" -e "s/ *$//"
  echo "# exit ${PIPESTATUS[0]}"
  echo '```'
  echo
}

{
  echo "# cgtool in a CI log"
  echo
  echo "Every block below is cgtool run with its output piped (\`| cat\`), as a CI runner records"
  echo "it: no terminal, so no terminal width. Regenerate with \`scripts/ci-log-transcript.sh\`."
  echo
  echo "## capture's tables, from the committed H100 report"
  echo
  echo "\`cgtool capture\` needs a GPU; \`cgtool report\` reprints the same size and totals tables"
  echo "from the report it wrote (NVIDIA H100 80GB HBM3, 2026-11-24, \`benchmarks/results/h100-2026-11-24-capture-session\`)."
  echo
  run report benchmarks/results/h100-2026-11-24-capture-session/speed/runs/speed-llama-3.1-8b/report.json --out "$out/capture"
  echo "## plan"
  echo
  run plan --trace examples/azure-conv-first-1000.jsonl --gpu H100-80GB --out "$out/plan"
  echo "## check"
  echo
  run check benchmarks/results/h100-2026-11-24-capture-session/speed/runs/speed-llama-3.1-8b/report.json \
    benchmarks/results/h100-2026-11-24-capture-session/speed/runs/speed-llama-3.1-8b-again/report.json --metric retained_mem,peak_mem
  echo "## errors: one line each, exit 2"
  echo
  run plan --trace examples/azure-conv-first-1000.jsonl --budget-graphs -3
  run plan --trace examples/azure-conv-first-1000.jsonl --budget-graph 3
  run check benchmarks/results/h100-2026-11-24-capture-session/speed/runs/speed-llama-3.1-8b/report.json \
    benchmarks/results/h100-2026-11-24-capture-session/speed/runs/speed-llama-3.1-8b/report.json --markdown /proc/nowhere/x.md
} > "$doc"
echo "wrote $doc"
