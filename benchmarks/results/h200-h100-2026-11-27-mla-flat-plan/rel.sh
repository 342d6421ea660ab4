nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $OUT/device.txt
date -u +%FT%TZ >> $OUT/device.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/device.txt
cat $OUT/device.txt
echo "$(date -u +%T) tests"
timeout ${TT:-200} python3 -m pytest -q -m gpu tests/test_mla_gpu.py ${TESTK:+-k "$TESTK"} > $OUT/gpu-tests.log 2>&1
tail -2 $OUT/gpu-tests.log
echo "$(date -u +%T) probe"
(cd benchmarks && PYTHONPATH=.. timeout 300 python3 probe_mla_release.py --out $OUT/release.json --rounds 5 \
  --cases ${CASES:-1x8192,8x1024,8x4096,16x1024,16x2048,17x1024,24x1024,32x1024,40x1024,48x1024,64x1024,32x8192} 2>&1 | tee $OUT/release.log | tail -14)
echo "$(date -u +%T) done"
