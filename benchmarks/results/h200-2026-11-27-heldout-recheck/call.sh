nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $OUT/device.txt
date -u +%FT%TZ >> $OUT/device.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/device.txt
git rev-parse --short HEAD >> $OUT/device.txt 2>/dev/null
cat $OUT/device.txt
echo "$(date -u +%T) tests"
timeout 300 python3 -m pytest -q -m gpu tests/test_mla_gpu.py > $OUT/gpu-tests.log 2>&1
echo "rc $?"; tail -3 $OUT/gpu-tests.log
echo "$(date -u +%T) verify"
MEM_PARTS= MEM_VERIFY_TIMEOUT=240 MEM_RUNS="deepseek-v2-lite:gpu-carry-mem/azure-conv-10001-11000.csv:azure" bash scripts/gpu-check.sh memory > $OUT/memory-run.log 2>&1
echo "rc $?"; grep -E "^\[|mem-fraction" $OUT/memory-run.log | tail -8
rm -f $OUT/results.tgz $OUT/install.log $OUT/bench-table.txt
echo "$(date -u +%T) done"
