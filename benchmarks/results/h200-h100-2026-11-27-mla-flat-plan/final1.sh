nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $OUT/device.txt
date -u +%FT%TZ >> $OUT/device.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/device.txt
cat $OUT/device.txt
echo "$(date -u +%T) tests"
timeout 200 python3 -m pytest -q -m gpu tests/test_mla_gpu.py > $OUT/gpu-tests.log 2>&1
tail -2 $OUT/gpu-tests.log
echo "$(date -u +%T) probe"
(cd benchmarks && PYTHONPATH=.. timeout 120 python3 probe_mla_projection.py --out $OUT/plan.json --with-store --rounds 5 \
  --before ../gpu-carry-mem/before --layers 27 --cases 17x1024,24x1024,32x1024,40x1024,48x1024,64x1024,16x2048+1x1024,32x8192,40x300+1x16000 2>&1 | tee $OUT/plan.log | tail -10)
echo "$(date -u +%T) verify"
MEM_PARTS= MEM_VERIFY_TIMEOUT=240 MEM_RUNS="deepseek-v2-lite:gpu-carry-mem/azure-conv-10001-11000.csv:azure" bash scripts/gpu-check.sh memory > $OUT/memory-run.log 2>&1
grep -E "^\[|mem-fraction" $OUT/memory-run.log | tail -8
rm -f $OUT/results.tgz $OUT/install.log $OUT/bench-table.txt
echo "$(date -u +%T) done"; ls -R $OUT | head -30
