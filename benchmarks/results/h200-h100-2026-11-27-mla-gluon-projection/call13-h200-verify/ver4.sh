nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $OUT/device.txt
date -u +%FT%TZ >> $OUT/device.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/device.txt
cat $OUT/device.txt
echo "$(date -u +%T) verify"
MEM_PARTS= MEM_VERIFY_TIMEOUT=240 MEM_RUNS="deepseek-v2-lite:gpu-carry-mem/azure-conv-10001-11000.csv:azure" bash scripts/gpu-check.sh memory > $OUT/memory-run.log 2>&1
echo "rc $?"; grep -E "^\[|mem-fraction|OK:" $OUT/memory-run.log | tail -6
rm -f $OUT/results.tgz $OUT/install.log $OUT/bench-table.txt
echo "$(date -u +%T) done"
