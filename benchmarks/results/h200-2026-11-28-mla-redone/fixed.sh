# Issue 33, 2026-11-28 (stop 77): FIXED_MAX trials. Tests first, then the probe.
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $OUT/device.txt
date -u +%FT%TZ >> $OUT/device.txt
git rev-parse --short HEAD >> $OUT/device.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/device.txt
cat $OUT/device.txt
if [ -n "$TESTS$TEST_FILES" ]; then
echo "$(date -u +%T) tests"
timeout ${TEST_LIMIT:-240} python3 -m pytest -q -m gpu ${TEST_FILES:-tests/test_mla_gpu.py} ${TESTS:+-k "$TESTS"} -p no:cacheprovider > $OUT/tests.log 2>&1; echo "rc $?"
tail -15 $OUT/tests.log | cut -c1-300
fi
if [ -n "$PCASES" ]; then
echo "$(date -u +%T) probe"
(cd benchmarks && PYTHONPATH=.. timeout ${PROBE_LIMIT:-240} python3 probe_mla_projection.py --out $OUT/probe.json --with-store --rounds ${ROUNDS:-5} --layers 27 \
  --cases $PCASES $PROBE_FLAGS > $OUT/probe.log 2>&1; cut -c1-600 $OUT/probe.log | tail -14)
fi
echo "$(date -u +%T) done"
if [ -n "$SHAPES" ]; then
echo "$(date -u +%T) wgmma-shapes"
OUT=$OUT/gpu-check timeout 300 bash scripts/gpu-check.sh wgmma-shapes > $OUT/gpu-check-wgmma.log 2>&1; echo "rc $?"
tail -14 $OUT/gpu-check-wgmma.log | cut -c1-200
fi
echo "$(date -u +%T) all done"
