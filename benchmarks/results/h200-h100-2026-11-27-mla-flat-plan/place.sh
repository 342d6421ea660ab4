nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $OUT/device.txt
date -u +%FT%TZ >> $OUT/device.txt
cat $OUT/device.txt
echo "$(date -u +%T) probe"
cd benchmarks && PYTHONPATH=.. timeout 400 python3 probe_mla_projection.py --out $OUT/probe.json --with-store --rounds ${ROUNDS:-5} \
  --layers 27 --settings "e:wg.RELEASE_AT_START=1;r184:MAX_REGISTERS=184;v32:BLOCK_V=32,MAX_REGISTERS=184;v32e:BLOCK_V=32,MAX_REGISTERS=184,wg.RELEASE_AT_START=1;r184e:MAX_REGISTERS=184,wg.RELEASE_AT_START=1" \
  --cases ${CASES:-17x1024,24x1024,32x1024,40x1024,48x1024,64x1024,16x2048+1x1024,32x8192} 2>&1 | tee $OUT/probe.log | tail -10
echo "$(date -u +%T) done"
