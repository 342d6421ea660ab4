# Issue 33, 2026-11-28: WIDE_STEP (the Gluon projection's programs of 33-64 slots projected first in two steps).
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $OUT/device.txt
date -u +%FT%TZ >> $OUT/device.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/device.txt
cat $OUT/device.txt
if [ -n "$WANT_H200" ] && ! grep -q H200 $OUT/device.txt; then echo "not an H200: nothing run"; exit 3; fi
if [ -n "$TESTS" ]; then
echo "$(date -u +%T) tests"
timeout ${TEST_LIMIT:-300} python3 -m pytest -q -x -m gpu tests/test_mla_gpu.py -k "$TESTS" > $OUT/gpu-tests.log 2>&1
echo "rc $?"; tail -4 $OUT/gpu-tests.log
fi
if [ -n "$PCASES" ]; then
echo "$(date -u +%T) probe"
(cd benchmarks && PYTHONPATH=.. timeout ${PROBE_LIMIT:-300} python3 probe_mla_projection.py --out $OUT/probe.json --with-store --rounds ${ROUNDS:-5} --layers 27 \
  --cases $PCASES --settings "$PSETTINGS" $PROBE_FLAGS 2>&1 | tee $OUT/probe.log | cut -c1-500 | tail -14)
fi
if [ -n "$STEP_BS" ]; then
for context in ${STEP_CONTEXT:-1024}; do
echo "$(date -u +%T) step $context"
(cd benchmarks && PYTHONPATH=.. timeout ${STEP_LIMIT:-200} python3 bench_mla_step_settings.py --out $OUT/step-$context.json \
  --settings "$STEP_SETTINGS" --context $context --bs $STEP_BS 2>&1 | tee $OUT/step-$context.log | cut -c1-400 | tail -8)
done
fi
echo "$(date -u +%T) done"
if [ -n "$SCASES" ]; then
echo "$(date -u +%T) stamps"
(cd benchmarks && PYTHONPATH=.. timeout 150 python3 probe_mla_projection_timeline.py --out $OUT/stamps.json --layers 27 \
  --cases $SCASES --settings "$SSETTINGS" 2>&1 | tee $OUT/stamps.log | cut -c1-900 | tail -12)
fi
echo "$(date -u +%T) done2"
