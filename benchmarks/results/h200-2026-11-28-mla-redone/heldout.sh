# Issue 33, 2026-11-28: deepseek-v2-lite's held-out verify with the MLA kernels as of 8979a83 (H200).
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $OUT/device.txt
date -u +%FT%TZ >> $OUT/device.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/device.txt
cat $OUT/device.txt
if [ -n "$WANT_H200" ] && ! grep -q H200 $OUT/device.txt; then echo "not an H200: nothing run"; exit 3; fi
echo "$(date -u +%T) verify"
MEM_PARTS= MEM_VERIFY_TIMEOUT=400 MEM_RUNS="deepseek-v2-lite:gpu-carry-mem/azure-conv-10001-11000.csv:azure" bash scripts/gpu-check.sh memory > $OUT/memory-run.log 2>&1
echo "rc $?"; grep -E "^\[|mem-fraction" $OUT/memory-run.log | tail -8
rm -f $OUT/results.tgz $OUT/install.log $OUT/bench-table.txt
echo "$(date -u +%T) done"
