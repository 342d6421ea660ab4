nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $OUT/device.txt
date -u +%FT%TZ >> $OUT/device.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/device.txt
cat $OUT/device.txt
echo "$(date -u +%T) probe"
(cd benchmarks && PYTHONPATH=.. timeout 300 python3 probe_mla_projection.py --out $OUT/probe.json --with-store --rounds 5 --layers 27 \
  --before ../gpu-carry-mem/before3 \
  --cases ${PCASES:-8x1024,8x4096,16x1024,16x2048,17x1024,24x1024,32x1024,48x1024,16x4096,32x8192,40x300+1x16000} \
  --settings "$PSETTINGS" 2>&1 | tee $OUT/probe.log | cut -c1-700 | tail -12)
echo "$(date -u +%T) stamps"
(cd benchmarks && PYTHONPATH=.. timeout 120 python3 probe_mla_projection_timeline.py --out $OUT/stamps.json --layers 27 \
  --cases 8x4096,16x2048,24x1024,32x1024 --settings "$SSETTINGS" 2>&1 | tee $OUT/stamps.log | cut -c1-420 | tail -8)
if [ -n "$TESTS" ]; then
echo "$(date -u +%T) tests"
timeout 240 python3 -m pytest -q -m gpu tests/test_mla_gpu.py > $OUT/gpu-tests.log 2>&1
tail -3 $OUT/gpu-tests.log
fi
echo "$(date -u +%T) done"
