nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt; date -u +%FT%TZ >> $OUT/device.txt
cd benchmarks
PYTHONPATH=.. timeout 200 python3 probe_mla_projection.py --out $OUT/probe.json --with-store --rounds 2 --layers 27 \
  --before ../gpu-carry-mem/before --cases 24x1024,32x1024 2>&1 | tee $OUT/probe.log | tail -4
PYTHONPATH=.. timeout 200 python3 probe_mla_release.py --out $OUT/release.json --rounds 2 --cases 8x4096,24x1024,32x1024 2>&1 | tee $OUT/release.log | tail -5
