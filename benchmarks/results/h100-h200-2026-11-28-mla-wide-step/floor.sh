# Issue 33, 2026-11-28: the read alone (bench_mla_floor.py) and the layers' probe at the same shapes, one call.
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $OUT/device.txt
date -u +%FT%TZ >> $OUT/device.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/device.txt
cat $OUT/device.txt
if [ -n "$WANT_H200" ] && ! grep -q H200 $OUT/device.txt; then echo "not an H200: nothing run"; exit 3; fi
if [ -n "$FCASES" ]; then
echo "$(date -u +%T) floor"
(cd benchmarks && PYTHONPATH=.. timeout ${FLOOR_LIMIT:-300} python3 bench_mla_floor.py --out $OUT/floor.json --splits '' \
  --cases $FCASES 2>&1 | tee $OUT/floor.log | cut -c1-300 | tail -20)
fi
if [ -n "$PCASES" ]; then
echo "$(date -u +%T) probe"
(cd benchmarks && PYTHONPATH=.. timeout ${PROBE_LIMIT:-300} python3 probe_mla_projection.py --out $OUT/probe.json --with-store --rounds ${ROUNDS:-3} --layers 27 \
  --cases $PCASES --settings "$PSETTINGS" $PROBE_FLAGS 2>&1 | tee $OUT/probe.log | cut -c1-400 | tail -20)
fi
echo "$(date -u +%T) done"
