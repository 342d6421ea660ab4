nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $OUT/device.txt
date -u +%FT%TZ >> $OUT/device.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/device.txt
cat $OUT/device.txt
echo "$(date -u +%T) probe"
(cd benchmarks && PYTHONPATH=.. timeout 300 python3 probe_mla_projection.py --out $OUT/probe.json --with-store --rounds 5 --layers 27 \
  --before ../gpu-carry-mem/before2 \
  --cases ${CASES:-5x1024,8x1024,8x4096,12x1024,16x1024,16x2048,17x1024,24x1024,32x1024,40x1024,48x1024,64x1024,16x4096,32x8192,40x300+1x16000} \
  --settings "${SETTINGS:-st1:SLOT_STAGES=1;st2:SLOT_STAGES=2;se0:wg.SLOTS_EARLY=0}" 2>&1 | tee $OUT/probe.log | cut -c1-700 | tail -16)
echo "$(date -u +%T) tests"
timeout 200 python3 -m pytest -q -m gpu tests/test_mla_gpu.py > $OUT/gpu-tests.log 2>&1
tail -2 $OUT/gpu-tests.log
rm -f $OUT/results.tgz $OUT/install.log $OUT/bench-table.txt
echo "$(date -u +%T) done"
