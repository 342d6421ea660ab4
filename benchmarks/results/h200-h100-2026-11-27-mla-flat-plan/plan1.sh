nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $OUT/device.txt
date -u +%FT%TZ >> $OUT/device.txt
cat $OUT/device.txt
echo "$(date -u +%T) tests"
timeout 330 python3 -m pytest -q -m gpu tests/test_mla_gpu.py -x ${TESTK:+-k "$TESTK"} > $OUT/gpu-tests.log 2>&1
tail -3 $OUT/gpu-tests.log
echo "$(date -u +%T) probe"
cd benchmarks && PYTHONPATH=.. timeout 240 python3 probe_mla_projection.py --out $OUT/plan.json --with-store --rounds ${ROUNDS:-5} \
  --before ../gpu-carry-mem/before --layers ${LAYERS:-27} ${SETTINGS:+--settings "$SETTINGS"} --cases ${CASES:-17x1024,24x1024,32x1024,40x1024,48x1024,64x1024,16x2048+1x1024,32x8192,40x300+1x16000} 2>&1 | tee $OUT/plan.log | tail -12
echo "$(date -u +%T) done"
