nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $OUT/device.txt
date -u +%FT%TZ >> $OUT/device.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/device.txt
cat $OUT/device.txt
echo "$(date -u +%T) probe"
(cd benchmarks && PYTHONPATH=.. timeout 300 python3 probe_mla_projection.py --out $OUT/probe.json --with-store --rounds 5 \
  --before ../gpu-carry-mem/before --layers 27 --cases 17x1024,24x1024,32x1024,40x1024,48x1024,64x1024,16x2048+1x1024,32x8192,40x300+1x16000 2>&1 | tee $OUT/probe.log | tail -10)
echo "$(date -u +%T) done"
