nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $OUT/device.txt
date -u +%FT%TZ >> $OUT/device.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/device.txt
cat $OUT/device.txt
if [ -n "$TESTS" ]; then
echo "$(date -u +%T) tests"
timeout ${TEST_LIMIT:-300} python3 -m pytest -q -x -m gpu tests/test_mla_gpu.py $TESTS_K > $OUT/gpu-tests.log 2>&1
echo "rc $?"; tail -4 $OUT/gpu-tests.log
fi
if [ -n "$PCASES" ]; then
echo "$(date -u +%T) probe"
(cd benchmarks && PYTHONPATH=.. timeout ${PROBE_LIMIT:-300} python3 probe_mla_projection.py --out $OUT/probe.json --with-store --rounds 5 --layers 27 \
  --cases $PCASES --settings "$PSETTINGS" 2>&1 | tee $OUT/probe.log | cut -c1-700 | tail -14)
fi
if [ -n "$SCASES" ]; then
echo "$(date -u +%T) stamps"
(cd benchmarks && PYTHONPATH=.. timeout 120 python3 probe_mla_projection_timeline.py --out $OUT/stamps.json --layers 27 \
  --cases $SCASES --settings "$SSETTINGS" 2>&1 | tee $OUT/stamps.log | cut -c1-420 | tail -8)
fi
echo "$(date -u +%T) done"
