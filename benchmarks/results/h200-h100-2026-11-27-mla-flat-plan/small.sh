nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt; date -u +%FT%TZ >> $OUT/device.txt
cd benchmarks
PYTHONPATH=.. timeout 300 python3 probe_mla_release.py --out $OUT/small.json --rounds 3 --settings "wgmma:tm.WGMMA_MIN_BS=${MINBS:-1}" \
  --cases ${CASES:-1x1024,1x8192,4x4096,8x1024,8x2048,8x4096,16x1024,16x2048,16x4096} 2>&1 | tee $OUT/small.log | tail -11
