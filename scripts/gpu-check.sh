#!/usr/bin/env bash
# Every GPU check and benchmark, for the GPU machine: the gpu-marked tests, then the capture
# benchmarks, then one table. Usage: scripts/gpu-check.sh [tests|speed|decode|piecewise|both|prefill|compile|all|tp|verify|hidden|moe|vit]...
# `hostgap` (by name only): benchmarks/bench_eager.py --after-compile and benchmarks/bench_replay.py.
# `linear` (by name only): benchmarks/bench_linear.py, decode-size linear layers.
# `eagercap` (by name only): benchmarks/bench_eager.py --after-captures, twice: the eager step before
# and after the 36 default decode graphs are captured in the process.
# `replay-ab` (by name only): decode-size linears read cold from HBM (cuBLAS, cuBLASLt, Triton
# GEMVs), then bs-1 replay captured under cuBLAS and cuBLASLt in alternating rounds, and after heat.
# `compile-cache` (by name only): issue 14's compile cache, llama-3.1-8b piecewise captured twice
# over one fresh cache folder (cold, then warm), the compile phases compared, then bench_compile_cache.py.
# `prefill-backends` (by name only): issue 38, breakable prefill graphs' GPU tests, then benchmarks/bench_prefill_backends.py in $OUT/engines.
# `moe-mla` (by name only): benchmarks/bench_moe_mla.py, issue 33's MoE/MLA kernel breakdown and sweep.
# `mla-timeline` (by name only): benchmarks/probe_mla_timeline.py, MLA decode's programs stamped
# (MLA_CASES picks BSxCONTEXT cases, MLA_VARIANTS the variants, MLA_AGAINST an older triton_mla.py
# timed as the "against" variant), in $OUT/mla-timeline.json.
# `peer-mla` (by name only): benchmarks/bench_peer_mla_decode.py, MLA decode beside SGLang's own Triton
# kernel on the same shapes (PEER_SGLANG: a folder holding an unpacked SGLang wheel, default
# gpu-carry-mem/sglang; PEER_CASES picks BSxCONTEXT cases), in $OUT/peer-mla.json.
# `mla-floor` (by name only): benchmarks/bench_mla_floor.py, MLA decode's latent read by kernels that
# only read it, beside the kernel (FLOOR_CASES picks BSxCONTEXT cases, FLOOR_SPLITS the merge
# kernel's chunk counts tried, FLOOR_MINS its least keys a chunk,
# FLOOR_FUSED chunk counts merged in the last program, FLOOR_WARPS warps to try there, FLOOR_VARIANTS
# other settings as --variants takes them, FLOOR_SKIP=1 without the flat read, FLOOR_STORE=1 each layer
# after the step's store too, with dependent launches and without), in $OUT/mla-floor.json.
# `kernel-census` (by name only): decode captures with --profile of CENSUS_MODELS at CENSUS_BS, every size's
# Chrome trace read by benchmarks/kernel_census.py: kernels a forward by family, in $OUT/census.{json,md}.
# `flat-verify` (by name only): `verify` of FLATV_PLAN on FLATV_TRACE (FLATV_FORMAT, FLATV_STEPS) with
# a module's flag (FLATV_SETTING, MODULE:NAME, default cgtool.attention.gluon_mla_wgmma:FLAT_CHUNKS) set per
# FLATV_ORDER ("1 0"), in $OUT/flat-verify.
# `mla-projection` (by name only): benchmarks/probe_mla_projection.py, MLA decode's merge in the value
# projection against the two apart (PROJ_CASES, PROJ_ROUNDS; PROJ_SETTINGS more settings of its kernel), in
# $OUT/mla-projection.json.
# `mla-redone` (by name only): issue 33's count of chunks MLA decode's stage 1 did twice: its GPU tests,
# then a deepseek-v2-lite decode capture's rows (REDONE_BS, REDONE_CONTEXT), in $OUT/mla-redone.
# `mla-dependent` (by name only): benchmarks/bench_mla_dependent.py, deepseek-v2-lite's decode graphs captured with
# MLA decode's stage 1 as the store's dependent and without, replayed in alternating rounds (DEPENDENT_BS,
# DEPENDENT_CONTEXT), in $OUT/mla-dependent.json.
# `mla-step` (by name only): benchmarks/bench_mla_step_settings.py, deepseek-v2-lite's decode graphs captured as
# shipped and under each of STEP_SETTINGS (default: the Triton projection), replayed in alternating rounds
# (STEP_BS, STEP_CONTEXT, which may list contexts), in $OUT/mla-step-CONTEXT.json.
# `verify-gap` (by name only): benchmarks/probe_verify_step_gap.py, deepseek-v2-lite's decode graphs
# replayed as a capture times them and as verify's steps run them, requests packed and spread
# (GAP_BS; GAP_CONTEXT, one run per context; GAP_MODES), in $OUT/verify-gap-CONTEXT.json.
# `graph-gaps` (by name only): benchmarks/probe_decode_after_prefill.py, each of GAPS_MODELS' decode graphs
# replayed alone, after one more capture and after its sizes recorded again (GAPS_BS, GAPS_CAPTURES; GAPS_ARGS more flags), in
# $OUT/graph-gaps-MODEL.json.
# `graph-gap-minimal` (by name only): benchmarks/probe_graph_gap_minimal.py, the graph gap with plain torch kernels
# only (GAPMIN_KERNELS, GAPMIN_EVENTS, GAPMIN_OP: torch, triton or triton_pdl), in $OUT/graph-gap-minimal.json.
# `extend-split` (by name only): benchmarks/bench_extend_split.py, extend attention over long
# cached prefixes with keys whole and split, in $OUT/extend-split.json (EXTEND_OLD, an older
# triton_extend.py, timed beside this one for llama-3.1-8b).
# `gemm-stages` (by name only): benchmarks/bench_gemm_stages.py, the grouped MoE GEMMs and a plain
# Triton GEMM at 1-5 pipeline stages, in $OUT/gemm-stages.json.
# `moe-grouped` (by name only): benchmarks/bench_moe_grouped.py, MoE experts at extend sizes on torch's
# grouped GEMM against the Triton path (GROUPED_TOKENS picks sizes; GROUPED_ARGS more of its flags), in
# $OUT/moe-grouped.json.
# `moe-tma` (by name only): benchmarks/bench_moe_tma.py, the extend GEMMs on cgtool's TMA grouped
# GEMM against torch's, over a sweep of launch settings (TMA_TOKENS picks sizes; TMA_ARGS more of
# its flags), in $OUT/moe-tma.json.
# `moe-joint` (by name only): benchmarks/probe_moe_joint.py, the gate/up GEMM's whole tiles as two
# products or one on equal experts (JOINT_ROWS picks the rows an expert), in $OUT/moe-joint.json.
# `wgmma-shapes` (by name only): benchmarks/bench_wgmma_shapes.py, one 64-key tile of MLA decode's
# products by form, its operands in shared memory (WGMMA_ROUNDS tiles a program), in $OUT/wgmma-shapes.json.
# `hidden` and `moe` (by name only): issue 17's hidden-state recapture and issue 19's MoE/MLA decode captures.
# `vit` (by name only): ViT graph GPU tests, then the Qwen2.5-VL-7B vision tower captured at VIT_SIZES, in $OUT/runs/vit.
# `verify`: verify's GPU tests and the llama-3.1-8b verify benchmark, in $OUT/verify
# (VERIFY_TRACE=path adds a Mooncake conversation trace, skipped when absent; VERIFY_PARTS picks
# and orders "tests azure mooncake").
# `memory` (by name only): per MEM_RUNS ("model:trace:format ...") plan, verify with its
# proven fraction, and plan --profile verify.json; then issue 32's memory parts (benchmarks/bench_memory_parts.py,
# MEM_PARTS= skips them); all in $OUT/memory.tgz.
# `replay` (by name only): issue 37, cgtool replay's GPU test, then slices of the Azure and Mooncake
# examples replayed (plan and default, twice) against the simulator, in $OUT/replay.tgz.
# `decode-chunks` (by name only): the dense decode kernel's one chunk length for the batch: its GPU tests
# and the padded-replay test, then benchmarks/bench_decode_chunks.py against the kernel it replaced
# (DECODE_OLD, default gpu-carry-mem/old_triton_decode.py), in $OUT/decode-chunks.
# `oom-diag` (by name only): benchmarks/diag_capture_oom.py, allocator readings through the OOM test's capture.
# `kernel-sweep` (by name only): benchmarks/bench_kernel_sweep.py, launch configurations of the dense decode
# kernel and of extend over long cached prefixes, in $OUT/kernel-sweep.
# `decode-contexts` (by name only): issue 37, llama-3.1-8b decode captured at CONTEXTS (1024 4096 8192 16384;
# the first with both kinds), for the replay profile's long-context attention, in $OUT/contexts.tgz.
# `tp` (two GPUs): tensor-parallel GPU tests and benchmarks/bench_tp.py, logs and reports in $OUT/tp.
# Logs and reports land under $OUT (default ./gpu-out), packed into results.tgz.
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT/runs"
export PYTHONUNBUFFERED=1
stages=${*:-all}
want() { [[ " $stages " == *" $1 "* || " $stages " == *" all "* ]]; }

python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 \
  || { echo "install failed"; tail -20 "$OUT/install.log"; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/device.txt"

if want speed; then  # issue 14: eager step, whole-session wall time and phases, profile size
  ts() { date +%H:%M:%S; }
  # A fresh compile cache: each model's first run traces, "again" (and --profile) reuse it.
  export CGTOOL_CACHE_DIR="$OUT/compile-cache-speed"; rm -rf "$CGTOOL_CACHE_DIR"
  echo "[$(ts)] eager bench"
  python3 benchmarks/bench_eager.py --model llama-3.1-8b --out "$OUT/runs/eager-llama-3.1-8b.json" \
    >"$OUT/runs/eager.log" 2>&1; tail -30 "$OUT/runs/eager.log"
  walls=()
  # "MODEL KIND [--profile|again]"; a decode-only run shows what counting kernels costs
  # where no piecewise compile imported dynamo first.
  for run in "qwen2.5-0.5b both" "llama-3.1-8b both" "llama-3.1-8b both --profile" "llama-3.1-8b both again" \
             "llama-3.1-8b decode"; do
    set -- $run; m=$1; kind=$2; tag=${3:-}; name="speed-$m"; extra=()
    [[ $kind != both ]] && name+="-$kind"; [[ -n $tag ]] && name+="-${tag#--}"; [[ $tag == --profile ]] && extra=(--profile)
    echo "[$(ts)] $name"
    start=$(date +%s.%N)
    cgtool capture --model "$m" --kind "$kind" "${extra[@]}" --out "$OUT/runs/$name" >"$OUT/runs/$name.log" 2>&1
    rc=$?; wall=$(python3 -c "import time; print(round(time.time() - $start, 1))")
    echo "[$(ts)] $name exit $rc wall ${wall}s"; grep -E "^\[ *[0-9.]+ s\]" "$OUT/runs/$name.log" | tail -12
    walls+=("$OUT/runs/$name=$wall")
  done
  ls -la "$OUT"/runs/speed-llama-3.1-8b-profile/*.pickle "$OUT"/runs/speed-llama-3.1-8b-profile/*.json 2>/dev/null
  python3 benchmarks/bench_phases.py "${walls[@]}" | tee "$OUT/phases.txt"
fi
if [[ " $stages " == *" oom-diag "* ]]; then  # by name only: the capture-reliability OOM test's memory, event by event
  python3 benchmarks/diag_capture_oom.py 2>&1 | tee "$OUT/oom-diag.log" | tail -60
fi
if want tests; then
  # GPU_TESTS narrows the run to some files or tests (default: every gpu-marked test).
  timeout -k 10 "${TESTS_TIMEOUT:-900}" python3 -m pytest -v -m gpu -p no:cacheprovider --continue-on-collection-errors ${GPU_TESTS:-tests} 2>&1 \
    | tee "$OUT/gpu-tests.log" | grep -vE " PASSED| SKIPPED" | tail -40
fi
if [[ " $stages " == *" linear "* ]]; then  # issue 14: decode-size linears, cuBLAS against a Triton GEMV
  echo "[$(date +%H:%M:%S)] linear bench"
  python3 benchmarks/bench_linear.py --out "$OUT/runs/linear.json" 2>&1 | tee "$OUT/runs/linear.log" | tail -90
  echo "[$(date +%H:%M:%S)] linear bench exit ${PIPESTATUS[0]}"
fi
if [[ " $stages " == *" replay-ab "* ]]; then  # issue 14: replay against the roofline
  echo "[$(date +%H:%M:%S)] linear bench, cold weights"
  python3 benchmarks/bench_linear.py --cold --m "${LINEAR_M:-1,4,16}" --out "$OUT/runs/linear-cold.json" 2>&1 \
    | tee "$OUT/runs/linear-cold.log" | tail -120
  echo "[$(date +%H:%M:%S)] replay under each BLAS library, and after heat"
  python3 benchmarks/bench_replay.py --bs 1 --blas cublas,cublaslt --heat "${HEAT_S:-15}" \
    --out "$OUT/runs/replay-ab.json" 2>&1 | tee "$OUT/runs/replay-ab.log" | tail -40
  echo "[$(date +%H:%M:%S)] replay-ab done"
fi
if [[ " $stages " == *" hostgap "* ]]; then  # issue 14: eager after dynamo compiled, replay's launch gap
  echo "[$(date +%H:%M:%S)] eager bench, before and after the piecewise compile"
  python3 benchmarks/bench_eager.py --model llama-3.1-8b --after-compile --out "$OUT/runs/eager-after-compile.json" \
    >"$OUT/runs/eager-after-compile.log" 2>&1; echo "exit $?"; tail -42 "$OUT/runs/eager-after-compile.log"
  echo "[$(date +%H:%M:%S)] eager prefill of 4 tokens (piecewise's eager path)"
  python3 benchmarks/bench_eager.py --model llama-3.1-8b --extend 4 --out "$OUT/runs/eager-extend4.json" \
    >"$OUT/runs/eager-extend4.log" 2>&1; echo "exit $?"; tail -62 "$OUT/runs/eager-extend4.log"
  echo "[$(date +%H:%M:%S)] replay bench"
  python3 benchmarks/bench_replay.py --model llama-3.1-8b --after-compile --out "$OUT/runs/replay.json" 2>&1 | tee "$OUT/runs/replay.log" | tail -8
  echo "[$(date +%H:%M:%S)] done"
fi
if [[ " $stages " == *" eagercap "* ]]; then  # issue 14: eager step before and after the decode captures
  for round in 1 2; do
    echo "[$(date +%H:%M:%S)] eager bench, before and after capturing the decode graphs ($round)"
    python3 benchmarks/bench_eager.py --model llama-3.1-8b --after-captures --out "$OUT/runs/eager-after-captures-$round.json" \
      >"$OUT/runs/eager-after-captures-$round.log" 2>&1; echo "exit $?"; tail -28 "$OUT/runs/eager-after-captures-$round.log"
  done
fi
if [[ " $stages " == *" compile-cache "* ]]; then  # issue 14.6: a second capture reuses the traced body
  cache="$OUT/compile-cache"; rm -rf "$cache"
  for run in cold warm; do
    echo "[$(date +%H:%M:%S)] compile-cache $run"
    start=$(date +%s.%N)
    CGTOOL_CACHE_DIR="$cache" timeout -k 10 "${CACHE_TIMEOUT:-400}" cgtool capture --model llama-3.1-8b --kind piecewise \
      --out "$OUT/runs/compile-cache-$run" >"$OUT/runs/compile-cache-$run.log" 2>&1
    rc=$?; wall=$(python3 -c "import time; print(round(time.time() - $start, 1))")
    echo "[$(date +%H:%M:%S)] compile-cache $run exit $rc wall ${wall}s"
  done
  python3 - "$OUT"/runs/compile-cache-{cold,warm}/report.json <<'PY' | tee "$OUT/compile-cache.txt"
import json, sys
for path in sys.argv[1:]:
    t = json.load(open(path))["totals"]
    phase_s = t.get("phase_s", {})
    phases = ", ".join(f"{k} {v:.2f}" for k, v in phase_s.items())
    print(f"{path}: compile cache {t.get('compile_cache')}; compile {phase_s.get('compile', 0):.2f} s; {phases}")
PY
  python3 benchmarks/bench_compile_cache.py --model llama-3.1-8b --device cuda --tokens 4096 \
    --rounds 2 --out "$OUT/runs/compile-cache-bench.json" 2>&1 | tail -4
fi
if [[ " $stages " == *" hidden "* ]]; then  # issue 17: hidden-state modes, NULL then FULL recapture
  echo "[$(date +%H:%M:%S)] hidden-states null,full"
  timeout -k 10 "${HIDDEN_TIMEOUT:-240}" cgtool capture --model llama-3.1-8b --kind decode --hidden-states null,full \
    --out "$OUT/runs/hidden-llama-3.1-8b" >"$OUT/runs/hidden-llama-3.1-8b.log" 2>&1
  echo "[$(date +%H:%M:%S)] hidden-states exit $?"; tail -25 "$OUT/runs/hidden-llama-3.1-8b.log"
fi
if [[ " $stages " == *" moe "* ]]; then  # issue 19: MoE/MLA presets, decode at the issue's sizes
  for m in ${MOE_MODELS:-deepseek-v2-lite qwen3-30b-a3b}; do
    echo "[$(date +%H:%M:%S)] moe $m ${MOE_ARGS:-}"
    timeout -k 10 "${MOE_TIMEOUT:-200}" cgtool capture --model "$m" --kind "${MOE_KIND:-decode}" --bs "${MOE_BS:-1,8,64,256}" \
      ${MOE_ARGS:-} --out "$OUT/runs/moe-$m" >"$OUT/runs/moe-$m.log" 2>&1
    echo "[$(date +%H:%M:%S)] moe $m exit $?"; tail -25 "$OUT/runs/moe-$m.log"
  done
fi
if [[ " $stages " == *" moe-mla "* ]]; then  # issue 33, by name only: MoE/MLA kernels against their limits
  echo "[$(date +%H:%M:%S)] bench_moe_mla ${MOE_MLA_ARGS:-}"
  timeout -k 10 "${MOE_MLA_TIMEOUT:-360}" python3 benchmarks/bench_moe_mla.py --out "$OUT/moe-mla.json" ${MOE_MLA_ARGS:-} \
    2>&1 | tee "$OUT/moe-mla.log"
  echo "[$(date +%H:%M:%S)] bench_moe_mla exit ${PIPESTATUS[0]}"
fi
if [[ " $stages " == *" mla-timeline "* ]]; then  # issue 33, by name only: MLA decode program by program
  echo "[$(date +%H:%M:%S)] probe_mla_timeline ${MLA_CASES:-}"
  timeout -k 10 "${MLA_TIMEOUT:-240}" python3 benchmarks/probe_mla_timeline.py --out "$OUT/mla-timeline.json" \
    ${MLA_CASES:+--cases "$MLA_CASES"} ${MLA_VARIANTS:+--variants "$MLA_VARIANTS"} \
    ${MLA_AGAINST:+--against "$MLA_AGAINST"} 2>&1 | tee "$OUT/mla-timeline.log"
  echo "[$(date +%H:%M:%S)] probe_mla_timeline exit ${PIPESTATUS[0]}"
fi
if [[ " $stages " == *" peer-mla "* ]]; then  # issue 33, by name only: MLA decode beside SGLang's kernel
  echo "[$(date +%H:%M:%S)] bench_peer_mla_decode ${PEER_CASES:-}"
  timeout -k 10 "${PEER_TIMEOUT:-300}" python3 benchmarks/bench_peer_mla_decode.py --out "$OUT/peer-mla.json" \
    --sglang "${PEER_SGLANG:-gpu-carry-mem/sglang}" ${PEER_CASES:+--cases "$PEER_CASES"} 2>&1 | tee "$OUT/peer-mla.log"
  echo "[$(date +%H:%M:%S)] bench_peer_mla_decode exit ${PIPESTATUS[0]}"
fi
if [[ " $stages " == *" mla-floor "* ]]; then  # issue 33, by name only: the read alone against the kernel
  echo "[$(date +%H:%M:%S)] bench_mla_floor ${FLOOR_CASES:-}"
  timeout -k 10 "${FLOOR_TIMEOUT:-400}" python3 benchmarks/bench_mla_floor.py --out "$OUT/mla-floor.json" \
    ${FLOOR_CASES:+--cases "$FLOOR_CASES"} ${FLOOR_SPLITS+--splits "$FLOOR_SPLITS"} ${FLOOR_MINS:+--mins "$FLOOR_MINS"} ${FLOOR_FUSED:+--fused "$FLOOR_FUSED"} ${FLOOR_WARPS:+--warps "$FLOOR_WARPS"} \
    ${FLOOR_VARIANTS:+--variants "$FLOOR_VARIANTS"} ${FLOOR_SKIP:+--skip-floor} ${FLOOR_STORE:+--after-store} \
    2>&1 | tee "$OUT/mla-floor.log"
  echo "[$(date +%H:%M:%S)] bench_mla_floor exit ${PIPESTATUS[0]}"
fi
if [[ " $stages " == *" kernel-census "* ]]; then  # issue 33, by name only: kernels a forward by family and size
  for m in ${CENSUS_MODELS:-deepseek-v2-lite qwen3-30b-a3b}; do
    bs=${CENSUS_BS:-1,2,4,8,12,16,20,24,33,48,64}; sizes=$(echo "$bs" | sed 's/[0-9]\+/decode:&/g')
    echo "[$(date +%H:%M:%S)] census capture $m"; mkdir -p "$OUT/census"
    timeout -k 10 "${CENSUS_TIMEOUT:-240}" cgtool capture --model "$m" --kind decode --bs "$bs" --context-len 1024 \
      --profile --profile-sizes "$sizes" --out "$OUT/census/$m" >"$OUT/census/$m.log" 2>&1
    echo "[$(date +%H:%M:%S)] census capture $m exit $?"
    find "$OUT/census/$m" -type f ! -name report.json ! -name 'trace_decode_*.json' ! -name sizes.csv -delete
  done
  python3 benchmarks/kernel_census.py "$OUT"/census/*/ --out "$OUT/census.json" --md "$OUT/census.md"
  echo "[$(date +%H:%M:%S)] kernel_census exit $?"
  for t in "$OUT"/census/*/trace_decode_*.json; do xz -9 "$t"; done
fi
if [[ " $stages " == *" flat-verify "* ]]; then  # issue 33, by name only: verify with MLA decode's flat chunks on and off
  for flat in ${FLATV_ORDER:-1 0}; do
    echo "[$(date +%H:%M:%S)] verify FLAT_CHUNKS=$flat"
    timeout -k 10 "${FLATV_TIMEOUT:-280}" python3 -c "import importlib, sys; \
m, n = sys.argv.pop(1).split(':'); setattr(importlib.import_module(m), n, sys.argv.pop(1) == '1'); \
from cgtool.commands.entry import main; sys.exit(main())" "${FLATV_SETTING:-cgtool.attention.gluon_mla_wgmma:FLAT_CHUNKS}" "$flat" verify \
      --plan "$FLATV_PLAN" --trace "$FLATV_TRACE" --format "${FLATV_FORMAT:-azure}" --steps "${FLATV_STEPS:-100}" \
      --repeats 2 --out "$OUT/flat-verify/flat$flat" >"$OUT/flat-verify-$flat.log" 2>&1
    echo "[$(date +%H:%M:%S)] verify FLAT_CHUNKS=$flat exit $?"
    rm -rf "$OUT/flat-verify/flat$flat/"*.png "$OUT/flat-verify/flat$flat/"*.html
  done
fi
if [[ " $stages " == *" mla-projection "* ]]; then  # issue 33, by name only: the merge in the value projection
  echo "[$(date +%H:%M:%S)] probe_mla_projection ${PROJ_CASES:-}"
  timeout -k 10 "${PROJ_TIMEOUT:-300}" python3 benchmarks/probe_mla_projection.py --out "$OUT/mla-projection.json" \
    ${PROJ_CASES:+--cases "$PROJ_CASES"} ${PROJ_ROUNDS:+--rounds "$PROJ_ROUNDS"} ${PROJ_SETTINGS:+--settings "$PROJ_SETTINGS"} \
    2>&1 | tee "$OUT/mla-projection.log"
  echo "[$(date +%H:%M:%S)] probe_mla_projection exit ${PIPESTATUS[0]}"
fi
if [[ " $stages " == *" mla-redone "* ]]; then  # issue 33, by name only: chunks stage 1 did twice
  D="$OUT/mla-redone"; mkdir -p "$D"
  dstamp() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$D/stage.log"; }
  dstamp "redone GPU tests"
  timeout -k 10 "${REDONE_TESTS_TIMEOUT:-300}" python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_mla_gpu.py \
    -k "fixed_maximum or did_twice or counts" >"$D/gpu-tests.log" 2>&1
  dstamp "redone GPU tests exit $?"; tail -3 "$D/gpu-tests.log" | tee -a "$D/stage.log"
  # The report's column from the CLI: deepseek-v2-lite's random weights, which never leave the range.
  timeout -k 10 "${REDONE_CAPTURE_TIMEOUT:-240}" cgtool capture --model deepseek-v2-lite --kind decode \
    --bs "${REDONE_BS:-1,8,24,64}" --context-len "${REDONE_CONTEXT:-1024}" --out "$D/capture" >"$D/capture.log" 2>&1
  dstamp "capture exit $?"; grep -A12 "decode graphs" "$D/capture.log" | tee -a "$D/stage.log"
  rm -f "$D/capture/"*.png "$D/capture/"*.html
fi
if [[ " $stages " == *" mla-dependent "* ]]; then  # issue 33, by name only: stage 1 as the store's dependent
  echo "[$(date +%H:%M:%S)] bench_mla_dependent ${DEPENDENT_BS:-}"
  timeout -k 10 "${DEPENDENT_TIMEOUT:-300}" python3 benchmarks/bench_mla_dependent.py --out "$OUT/mla-dependent.json" \
    ${DEPENDENT_BS:+--bs "$DEPENDENT_BS"} ${DEPENDENT_CONTEXT:+--context "$DEPENDENT_CONTEXT"} 2>&1 | tee "$OUT/mla-dependent.log"
  echo "[$(date +%H:%M:%S)] bench_mla_dependent exit ${PIPESTATUS[0]}"
fi
if [[ " $stages " == *" mla-step "* ]]; then  # issue 33, by name only: MLA settings in whole decode steps
  for context in ${STEP_CONTEXT:-1024}; do
    echo "[$(date +%H:%M:%S)] bench_mla_step_settings context $context ${STEP_BS:-}"
    timeout -k 10 "${STEP_TIMEOUT:-300}" python3 benchmarks/bench_mla_step_settings.py --out "$OUT/mla-step-$context.json" \
      --settings "${STEP_SETTINGS:-tr:GLUON_KERNEL=0}" --context "$context" ${STEP_BS:+--bs "$STEP_BS"} \
      2>&1 | tee "$OUT/mla-step-$context.log"
    echo "[$(date +%H:%M:%S)] bench_mla_step_settings context $context exit ${PIPESTATUS[0]}"
  done
fi
if [[ " $stages " == *" verify-gap "* ]]; then  # issue 33, by name only: verify's steps against capture's replays
  for context in ${GAP_CONTEXT:-1024}; do
    echo "[$(date +%H:%M:%S)] probe_verify_step_gap ${GAP_BS:-} at $context"
    timeout -k 10 "${GAP_TIMEOUT:-300}" python3 benchmarks/probe_verify_step_gap.py --out "$OUT/verify-gap-$context.json" \
      --context "$context" ${GAP_BS:+--bs "$GAP_BS"} ${GAP_MODES:+--modes "$GAP_MODES"} 2>&1 | tee "$OUT/verify-gap-$context.log"
    echo "[$(date +%H:%M:%S)] probe_verify_step_gap exit ${PIPESTATUS[0]}"
  done
fi
if [[ " $stages " == *" graph-gaps "* ]]; then  # issue 33, by name only: decode replays before and after another capture
  for m in ${GAPS_MODELS:-llama-3.1-8b qwen3-30b-a3b deepseek-v2-lite}; do
    echo "[$(date +%H:%M:%S)] probe_decode_after_prefill $m"
    (cd benchmarks && timeout -k 10 200 python3 probe_decode_after_prefill.py --model "$m" --out "$OUT/graph-gaps-$m.json" \
      --bs "${GAPS_BS:-1,8,32}" --captures "${GAPS_CAPTURES:-tiny_kept,same_stream}" ${GAPS_ARGS:-}) 2>&1 | tee "$OUT/graph-gaps-$m.log"
    echo "[$(date +%H:%M:%S)] probe_decode_after_prefill exit ${PIPESTATUS[0]}"
  done
fi
if [[ " $stages " == *" graph-gap-minimal "* ]]; then  # issue 33, by name only: the graph gap without cgtool's kernels
  echo "[$(date +%H:%M:%S)] probe_graph_gap_minimal"
  (cd benchmarks && timeout -k 10 200 python3 probe_graph_gap_minimal.py --out "$OUT/graph-gap-minimal.json" \
    --kernels "${GAPMIN_KERNELS:-600}" --events "${GAPMIN_EVENTS:-tiny,eager,tiny,again,tiny}" --op "${GAPMIN_OP:-torch}") 2>&1 | tee "$OUT/graph-gap-minimal.log"
  echo "[$(date +%H:%M:%S)] probe_graph_gap_minimal exit ${PIPESTATUS[0]}"
fi
if [[ " $stages " == *" extend-split "* ]]; then  # issue 33, by name only: few new tokens, long prefixes
  echo "[$(date +%H:%M:%S)] bench_extend_split"
  timeout -k 10 300 python3 benchmarks/bench_extend_split.py --out "$OUT/extend-split.json" \
    ${EXTEND_OLD:+--against "$EXTEND_OLD"} 2>&1 | tee "$OUT/extend-split.log"
  echo "[$(date +%H:%M:%S)] bench_extend_split exit ${PIPESTATUS[0]}"
fi
if [[ " $stages " == *" gemm-stages "* ]]; then  # issue 33, by name only: the MoE GEMMs by pipeline stages
  echo "[$(date +%H:%M:%S)] bench_gemm_stages"
  timeout -k 10 120 python3 benchmarks/bench_gemm_stages.py --out "$OUT/gemm-stages.json" 2>&1 | tee "$OUT/gemm-stages.log"
  echo "[$(date +%H:%M:%S)] bench_gemm_stages exit ${PIPESTATUS[0]}"
fi
if [[ " $stages " == *" moe-tma "* ]]; then  # issue 33, by name only: extend GEMMs on TMA tiles
  echo "[$(date +%H:%M:%S)] bench_moe_tma"
  timeout -k 10 500 python3 benchmarks/bench_moe_tma.py --out "$OUT/moe-tma.json" \
    ${TMA_TOKENS:+--tokens "$TMA_TOKENS"} ${TMA_ARGS:-} 2>&1 | tee "$OUT/moe-tma.log"
  echo "[$(date +%H:%M:%S)] bench_moe_tma exit ${PIPESTATUS[0]}"
fi
if [[ " $stages " == *" wgmma-shapes "* ]]; then  # issue 33, by name only: a tile's products, part by part
  echo "[$(date +%H:%M:%S)] wgmma-shapes"
  timeout -k 10 200 python3 benchmarks/bench_wgmma_shapes.py --out "$OUT/wgmma-shapes.json" \
    --rounds "${WGMMA_ROUNDS:-2000}" 2>&1 | tee "$OUT/wgmma-shapes.log"
  echo "[$(date +%H:%M:%S)] wgmma-shapes exit ${PIPESTATUS[0]}"
fi
if [[ " $stages " == *" moe-joint "* ]]; then  # issue 33, by name only: the gate/up tile's joint product
  echo "[$(date +%H:%M:%S)] probe_moe_joint"
  timeout -k 10 200 python3 benchmarks/probe_moe_joint.py --out "$OUT/moe-joint.json" \
    ${JOINT_ROWS:+--rows "$JOINT_ROWS"} 2>&1 | tee "$OUT/moe-joint.log"
  echo "[$(date +%H:%M:%S)] probe_moe_joint exit ${PIPESTATUS[0]}"
fi
if [[ " $stages " == *" moe-grouped "* ]]; then  # issue 33, by name only: extend MoE on the grouped GEMM
  echo "[$(date +%H:%M:%S)] bench_moe_grouped"
  timeout -k 10 300 python3 benchmarks/bench_moe_grouped.py --out "$OUT/moe-grouped.json" \
    ${GROUPED_TOKENS:+--tokens "$GROUPED_TOKENS"} ${GROUPED_ARGS:-} 2>&1 | tee "$OUT/moe-grouped.log"
  echo "[$(date +%H:%M:%S)] bench_moe_grouped exit ${PIPESTATUS[0]}"
fi
if want decode; then
  cgtool capture --model llama-3.1-8b --kind decode --max-bs 256 --mem-fraction-static 0.85 \
    --context-len 1024 --out "$OUT/runs/llama8b-decode" >"$OUT/runs/llama8b-decode.log" 2>&1
  echo "llama-3.1-8b decode exit $?"
  cgtool capture --model qwen2.5-0.5b --kind decode --max-bs 256 --out "$OUT/runs/qwen05b-decode" \
    >"$OUT/runs/qwen05b-decode.log" 2>&1
  echo "qwen2.5-0.5b decode exit $?"
fi
if want piecewise; then
  cgtool capture --model qwen2.5-0.5b --kind piecewise --max-tokens 4096 \
    --out "$OUT/runs/qwen05b-piecewise" >"$OUT/runs/qwen05b-piecewise.log" 2>&1
  echo "qwen2.5-0.5b piecewise exit $?"
  cgtool capture --model llama-3.1-8b --kind piecewise --max-tokens 4096 \
    --out "$OUT/runs/llama8b-piecewise" >"$OUT/runs/llama8b-piecewise.log" 2>&1
  echo "llama-3.1-8b piecewise exit $?"
fi
if want both; then
  for m in qwen2.5-0.5b llama-3.1-8b; do
    cgtool capture --model $m --kind both --out "$OUT/runs/both-$m" >"$OUT/runs/both-$m.log" 2>&1
    echo "$m --kind both exit $?"; grep -E "verified|incomplete|unsafe|capture_s|graph pool" "$OUT/runs/both-$m.log" | tail -5
  done
fi
if want prefill; then
  for m in qwen2.5-0.5b llama-3.1-8b; do
    python3 benchmarks/bench_piecewise.py --model $m --out "$OUT/runs/prefill-$m.json" 2>&1 \
      | tee "$OUT/runs/prefill-$m.log" | tail -8
  done
fi
if want compile; then
  for m in qwen2.5-0.5b llama-3.1-8b; do
    python3 benchmarks/bench_compile.py --model $m --out "$OUT/runs/compile-$m.json" 2>&1 \
      | tee "$OUT/runs/compile-$m.log" | tail -42
  done
fi
if [[ " $stages " == *" vit "* ]]; then  # issue 17: ViT graphs per image shape, by name only
  vstamp() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/runs/vit-phases.log"; }
  vstamp "vit GPU tests"
  timeout -k 10 "${VIT_TESTS_TIMEOUT:-300}" python3 -m pytest -q -s -m gpu -p no:cacheprovider \
    tests/test_vit_gpu.py >"$OUT/runs/vit-gpu-tests.log" 2>&1
  vstamp "vit GPU tests exit $?"; tail -5 "$OUT/runs/vit-gpu-tests.log"
  vstamp "vit capture ${VIT_SIZES:=448x448,560x840,896x896,1344x1344}"
  timeout -k 10 "${VIT_TIMEOUT:-240}" cgtool capture --model qwen2.5-vl-7b --kind vit --image-sizes "$VIT_SIZES" \
    --out "$OUT/runs/vit" >"$OUT/runs/vit.log" 2>&1
  vstamp "vit capture exit $?"; tail -30 "$OUT/runs/vit.log"
fi
if [[ " $stages " == *" tp "* ]]; then  # asked for by name only (not in "all"): needs two GPUs
  export NCCL_NVLS_ENABLE=0  # the lent two-GPU machine's notes: leave NVLink multicast off
  mkdir -p "$OUT/tp"
  # Time limits: a collective that never matches hangs rather than fails.
  timeout -k 10 "${TP_TEST_TIMEOUT:-900}" python3 -m pytest -q -s -m gpu -p no:cacheprovider \
    tests/test_tp_gpu.py 2>&1 | tee "$OUT/tp/gpu-tests.log" | tail -30
  timeout -k 10 "${TP_BENCH_TIMEOUT:-1800}" python3 benchmarks/bench_tp.py --model llama-3.1-8b \
    --out "$OUT/tp" 2>&1 | tee "$OUT/tp/bench.log" | tail -30
fi
if [[ " $stages " == *" verify "* ]]; then  # asked for by name only
  V="$OUT/verify"; mkdir -p "$V"
  stamp() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$V/phases.log"; }
  parts=" ${VERIFY_PARTS:-tests azure mooncake} "  # which of verify's parts, in this order
  bench() {  # name trace format
    cgtool plan --trace "$2" --format "$3" --model llama-3.1-8b --out "$V/$1/plan" >"$V/$1-plan.log" 2>&1
    stamp "$1 plan exit $?"
    start=$(date +%s)
    timeout -k 10 "${VERIFY_TIMEOUT:-600}" cgtool verify --plan "$V/$1/plan/plan.json" --trace "$2" --format "$3" --steps 2000 \
      --out "$V/$1/verify" >"$V/$1-verify.log" 2>&1
    rc=$?; stamp "$1 verify exit $rc in $(( $(date +%s) - start )) s"; tail -40 "$V/$1-verify.log"
  }
  for part in $parts; do case $part in
    tests) stamp "verify GPU tests"
      timeout -k 10 "${VERIFY_TESTS_TIMEOUT:-600}" python3 -m pytest -q -s -m gpu -p no:cacheprovider \
        tests/test_verify_gpu.py >"$V/gpu-tests.log" 2>&1
      stamp "verify GPU tests exit $?"; tail -5 "$V/gpu-tests.log" ;;
    azure) bench azure examples/azure-conv-first-1000.jsonl cgtool ;;
    mooncake) if [[ -n "${VERIFY_TRACE:-}" && -f "$VERIFY_TRACE" ]]; then
        bench mooncake "$VERIFY_TRACE" "${VERIFY_TRACE_FORMAT:-mooncake}"
      else stamp "mooncake: skipped (set VERIFY_TRACE to a trace in the repo copy)"; fi ;;
  esac; done
fi
if [[ " $stages " == *" prefill-backends "* ]]; then  # issue 38, by name only: breakable beside torch.compile
  E="$OUT/engines"; mkdir -p "$E"
  echo "[$(date +%H:%M:%S)] breakable GPU tests" | tee -a "$E/stage.log"
  timeout -k 10 "${PREFILL_TESTS_TIMEOUT:-240}" python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_breakable.py >"$E/gpu-tests.log" 2>&1
  echo "[$(date +%H:%M:%S)] breakable GPU tests exit $?" | tee -a "$E/stage.log"; tail -15 "$E/gpu-tests.log"
  python3 benchmarks/bench_prefill_backends.py --out "$E" --models "${PREFILL_MODELS:-llama-3.1-8b,qwen3-30b-a3b}" \
    --tokens "${PREFILL_TOKENS:-256,1024,4096}" 2>&1 | tee -a "$E/stage.log"
fi
if [[ " $stages " == *" memory "* ]]; then  # issue 32, by name only: memory parts, then verify's proven fraction
  M="$OUT/memory"; mkdir -p "$M"
  mstamp() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$M/phases.log"; }
  # "MODEL:TRACE:FORMAT" runs: plan, verify (its proof included), then plan --profile verify.json
  for run in ${MEM_RUNS:-llama-3.1-8b:examples/azure-conv-first-1000.jsonl:cgtool}; do
    IFS=: read -r m trace fmt <<<"$run"; name="$m-$(basename "${trace%%.*}")"; d="$M/$name"; mkdir -p "$d"
    cgtool plan --trace "$trace" --format "$fmt" --model "$m" --out "$d/plan" >"$d-plan.log" 2>&1
    mstamp "$name plan exit $?"
    timeout -k 10 "${MEM_VERIFY_TIMEOUT:-300}" cgtool verify --plan "$d/plan/plan.json" --trace "$trace" --format "$fmt" \
      --steps "${MEM_STEPS:-100}" --repeats 2 --out "$d/verify" >"$d-verify.log" 2>&1
    mstamp "$name verify exit $?"; grep -E "^\[|recommended|proven|headroom" "$d-verify.log" | tail -16
    cgtool plan --trace "$trace" --format "$fmt" --model "$m" --profile "$d/verify/verify.json" --out "$d/replan" \
      >"$d-replan.log" 2>&1; mstamp "$name plan --profile exit $?"; grep -E "mem-fraction-static" "$d-replan.log" | head -3
    rm -rf "$d/plan/"*.png "$d/verify/"*.png "$d/replan/"*.png "$d"/*/*.html 2>/dev/null
  done
  if [[ -n "${MEM_PARTS-1}" ]]; then
    mstamp "memory parts ${MEM_MODELS:=llama-3.1-8b qwen3-30b-a3b deepseek-v2-lite}"
    timeout -k 10 "${MEM_PARTS_TIMEOUT:-300}" python3 benchmarks/bench_memory_parts.py --models "${MEM_MODELS// /,}" \
      --out "$M/parts.json" >"$M/parts.log" 2>&1; mstamp "memory parts exit $?"; tail -c 3000 "$M/parts.log"
  fi
  tar czf "$OUT/memory.tgz" -C "$OUT" memory && rm -rf "$M"
fi
if [[ " $stages " == *" replay "* ]]; then  # issue 37, by name only: cgtool replay against the simulator
  R="$OUT/replay"; mkdir -p "$R"
  rstamp() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/replay-stage.log"; }
  if [[ -z "${REPLAY_SKIP_TESTS:-}" ]]; then
    rstamp "replay GPU tests"
    timeout -k 10 "${REPLAY_TESTS_TIMEOUT:-240}" python3 -m pytest -q -m gpu -p no:cacheprovider \
      tests/test_replay_gpu.py >"$R/gpu-tests.log" 2>&1
    rstamp "replay GPU tests exit $?"; tail -5 "$R/gpu-tests.log" | tee -a "$OUT/replay-stage.log"
  fi
  # Slices: the first N requests of each trace, planned at the load they are replayed at.
  head -"${REPLAY_AZURE_N:-300}" examples/azure-conv-first-1000.jsonl >"$R/azure.jsonl"
  head -"${REPLAY_MOONCAKE_N:-70}" "${REPLAY_MOONCAKE_TRACE:-examples/mooncake-conv-first-200.jsonl}" >"$R/mooncake.jsonl"
  az_load=${REPLAY_AZURE_LOAD:-2}; mc_load=${REPLAY_MOONCAKE_LOAD:-0.35}
  gpu=$(python3 -c "import torch; from cgtool.specs.gpus import match_nvml_name as m; print(m(torch.cuda.get_device_name(0)).name)")
  cgtool plan --trace "$R/azure.jsonl" --model llama-3.1-8b --gpu "$gpu" --load "$az_load" --out "$R/plan-azure" >"$R/plan-azure.log" 2>&1
  cgtool plan --trace "$R/mooncake.jsonl" --model llama-3.1-8b --gpu "$gpu" --load "$mc_load" --out "$R/plan-mooncake" >"$R/plan-mooncake.log" 2>&1
  rstamp "plans exit $?"
  # The prediction's --profile: a capture of the same model on this GPU (it also fills the compile
  # cache), or REPLAY_PROFILE, one such capture's report.json kept from an earlier call.
  if [[ -n "${REPLAY_PROFILE:-}" ]]; then mkdir -p "$R/capture"; cp "$REPLAY_PROFILE" "$R/capture/report.json"; else
  timeout -k 10 "${REPLAY_CAPTURE_TIMEOUT:-150}" cgtool capture --model llama-3.1-8b --bs "${REPLAY_PROFILE_BS:-1,2,4,8,16,24,32,48,64,96,128,192,256}" \
    --tokens "${REPLAY_PROFILE_TOKENS:-64,128,256,512,1024,2048,4096,8192}" --out "$R/capture" >"$R/capture.log" 2>&1
  rstamp "profile capture exit $?"; grep -E "^\[ *[0-9.]+ s\]" "$R/capture.log" | tail -4; fi
  cases=() ; a="$R/azure.jsonl,$R/plan-azure/plan.json"; m="$R/mooncake.jsonl,$R/plan-mooncake/plan.json"
  # REPLAY_CASES: "slice-schedule-repeat" names, in the order run (the budget skips the last).
  for c in ${REPLAY_CASES:-azure-default-1 mooncake-default-1 azure-plan-1 mooncake-plan-1 azure-default-2 mooncake-default-2 azure-plan-2 mooncake-plan-2}; do
    IFS=- read -r slice schedule _ <<<"$c"
    if [[ $slice == azure ]]; then cases+=(--case "$c=$a,$schedule,${REPLAY_AZURE_N:-300},$az_load")
    else cases+=(--case "$c=$m,$schedule,${REPLAY_MOONCAKE_N:-70},$mc_load"); fi
  done
  python3 benchmarks/bench_replay_trace.py run --out "$R/runs" --budget-s "${REPLAY_BUDGET_S:-400}" "${cases[@]}" 2>&1 | tee -a "$OUT/replay-stage.log"
  compgen -G "$R/runs/*.json" >/dev/null && [[ -f "$R/capture/report.json" ]] && python3 benchmarks/bench_replay_trace.py predict --profile "$R/capture/report.json" --gpu "$gpu" \
    "$R"/runs/*.json 2>&1 | tee -a "$OUT/replay-stage.log"
  tar czf "$OUT/replay.tgz" -C "$R" runs capture/report.json plan-azure/plan.json plan-mooncake/plan.json gpu-tests.log capture.log 2>/dev/null
  rm -rf "$R"
fi
if [[ " $stages " == *" decode-chunks "* ]]; then  # by name only: one chunk length for the batch
  D="$OUT/decode-chunks"; mkdir -p "$D"
  echo "[$(date +%H:%M:%S)] decode GPU tests" | tee -a "$D/stage.log"
  timeout -k 10 "${CHUNK_TESTS_TIMEOUT:-300}" python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_triton_decode.py tests/test_decode_runner.py >"$D/gpu-tests.log" 2>&1
  echo "[$(date +%H:%M:%S)] decode GPU tests exit $?" | tee -a "$D/stage.log"; tail -8 "$D/gpu-tests.log"
  timeout -k 10 "${CHUNK_BENCH_TIMEOUT:-240}" python3 benchmarks/bench_decode_chunks.py \
    --old "${DECODE_OLD:-gpu-carry-mem/old_triton_decode.py}" --out "$D/decode-chunks.json" 2>&1 | tee "$D/bench.log"
  echo "[$(date +%H:%M:%S)] decode chunk bench exit ${PIPESTATUS[0]}" | tee -a "$D/stage.log"
fi
if [[ " $stages " == *" kernel-sweep "* ]]; then  # by name only: decode and extend launch configurations
  mkdir -p "$OUT/kernel-sweep"
  timeout -k 10 "${SWEEP_TIMEOUT:-400}" python3 benchmarks/bench_kernel_sweep.py --out "$OUT/kernel-sweep/sweep.json" 2>&1 \
    | tee "$OUT/kernel-sweep/sweep.log"
  echo "[$(date +%H:%M:%S)] kernel sweep exit ${PIPESTATUS[0]}"
fi
if [[ " $stages " == *" decode-contexts "* ]]; then  # issue 37, by name only: decode timed at several contexts
  # The first context captures both kinds (the replay's --profile); the others decode alone, at
  # sizes whose requests fit the pool at that context. cgtool.planner.profile_fit fits attention's
  # per-token price across them (merge_context_reports).
  C="$OUT/contexts"; mkdir -p "$C"; first=1
  for ctx in ${CONTEXTS:-1024 4096 8192 16384}; do
    if ((first)); then args=(--bs "${REPLAY_PROFILE_BS:-1,2,4,8,16,24,32,48,64,96,128,192,256}" --tokens "${REPLAY_PROFILE_TOKENS:-64,128,256,512,1024,2048,4096,8192}")
    else args=(--kind decode --bs "${CONTEXT_BS:-1,2,4,8,16,24,32}"); fi
    timeout -k 10 "${CONTEXT_TIMEOUT:-150}" cgtool capture --model llama-3.1-8b --context-len "$ctx" "${args[@]}" \
      --out "$C/ctx-$ctx" >"$C/ctx-$ctx.log" 2>&1
    echo "[$(date +%H:%M:%S)] context $ctx capture exit $?" | tee -a "$OUT/contexts.log"; first=0
    grep -E "^\[ *[0-9.]+ s\]" "$C/ctx-$ctx.log" | tail -3 | tee -a "$OUT/contexts.log"
  done
  (cd "$C" && tar czf "$OUT/contexts.tgz" ctx-*/report.json ctx-*.log); rm -rf "$C"
fi
python3 benchmarks/bench_table.py "$OUT/runs" | tee "$OUT/bench-table.txt"
tar czf "$OUT/results.tgz" -C "$OUT" runs $([[ -d "$OUT/verify" ]] && echo verify)
rm -rf "$OUT/runs" "$OUT/verify"
