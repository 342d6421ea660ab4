nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $OUT/device.txt
date -u +%FT%TZ >> $OUT/device.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/device.txt
cat $OUT/device.txt
echo "$(date -u +%T) tests"
timeout 170 python3 -m pytest -q -m gpu tests/test_mla_gpu.py > $OUT/gpu-tests.log 2>&1
tail -2 $OUT/gpu-tests.log
echo "$(date -u +%T) probe"
(cd benchmarks && PYTHONPATH=.. timeout 120 python3 probe_mla_projection.py --out $OUT/probe.json --with-store --rounds 3 --layers 27 \
  --cases 5x1024,8x1024,8x4096,12x1024,16x1024,16x2048,16x4096,32x1024 2>&1 | tee $OUT/probe.log | tail -9)
if [[ -n "${CENSUS:-}" ]]; then
echo "$(date -u +%T) census"
CENSUS_MODELS=deepseek-v2-lite CENSUS_TIMEOUT=200 bash scripts/gpu-check.sh kernel-census > $OUT/census-run.log 2>&1
tail -3 $OUT/census-run.log; rm -rf $OUT/census; ls $OUT
fi
rm -f $OUT/results.tgz $OUT/install.log $OUT/bench-table.txt
echo "$(date -u +%T) done"
