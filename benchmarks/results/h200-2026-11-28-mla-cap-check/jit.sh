# Issue 33, 2026-11-28: the MLA program count as a runtime argument (PATCH, default
# runtime-programs.patch, in the tree: "runtime") against the constexpr (the patch reversed:
# "constexpr"): GPU tests, then cold decode captures of deepseek-v2-lite at its held-out plan's
# sizes, each with a Triton cache of its own. Call 5 ran runtime-programs.patch, call 6
# runtime-all.patch (with the flat launches' NUM_SPLITS fixed too).
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $OUT/device.txt
date -u +%FT%TZ >> $OUT/device.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/device.txt
cat $OUT/device.txt
if [ -n "$WANT_H200" ] && ! grep -q H200 $OUT/device.txt; then echo "not an H200: nothing run"; exit 3; fi
python3 -m pip install -q --no-deps --no-build-isolation -e . > $OUT/install.log 2>&1
if [ -n "$TESTS" ]; then
echo "$(date -u +%T) tests"
timeout ${TEST_LIMIT:-300} python3 -m pytest -q -m gpu tests/test_mla_gpu.py -k "$TESTS" > $OUT/gpu-tests.log 2>&1
echo "rc $?"; tail -2 $OUT/gpu-tests.log
fi
BS=1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,19,20,22,24,26,27,29,32,34,36,38,42,47,64,72,80
for build in ${BUILDS:-constexpr runtime constexpr runtime}; do
  if [ $build = constexpr ]; then patch -s -p1 -R < gpu-carry-mem/${PATCH:-runtime-programs.patch}; fi
  grep -c "PROGRAMS: gl.constexpr" cgtool/attention/gluon_mla_wgmma.py
  export TRITON_CACHE_DIR=$(mktemp -d) CGTOOL_CACHE_DIR=$(mktemp -d)
  echo "$(date -u +%T) capture $build"
  start=$(date +%s.%N)
  timeout 240 cgtool capture --model deepseek-v2-lite --kind decode --bs $BS --out /tmp/cap-$build > $OUT/capture-$build.log 2>&1
  rc=$?; wall=$(python3 -c "import time; print(round(time.time() - $start, 1))")
  stage1=$(ls $TRITON_CACHE_DIR/*/ | grep -c "^_mla_decode_stage1_wgmma.*\.cubin$")
  plan=$(ls $TRITON_CACHE_DIR/*/ | grep -c "^_flat_plan_kernel.*\.cubin$")
  all=$(ls $TRITON_CACHE_DIR/*/ | grep -c "\.cubin$")
  echo "$(date -u +%T) $build rc $rc wall ${wall}s; cubins: stage 1 $stage1, plan $plan, all $all" | tee -a $OUT/jit.txt
  grep -E "^\[ *[0-9.]+ s\]" $OUT/capture-$build.log | tail -4
  if [ $build = constexpr ]; then patch -s -p1 < gpu-carry-mem/${PATCH:-runtime-programs.patch}; fi
  rm -rf $TRITON_CACHE_DIR $CGTOOL_CACHE_DIR
done
echo "$(date -u +%T) done"
