nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $OUT/device.txt
date -u +%FT%TZ >> $OUT/device.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/device.txt
cat $OUT/device.txt
echo "$(date -u +%T) probe"
(cd benchmarks && PYTHONPATH=.. timeout 300 python3 probe_mla_projection.py --out $OUT/probe.json --with-store --rounds 5 --layers 27 \
  --cases ${CASES} --settings "${SETTINGS}" 2>&1 | tee $OUT/probe.log | cut -c1-600 | tail -16)
if [[ -n "${SMALL:-}" ]]; then
echo "$(date -u +%T) small"
(cd benchmarks && PYTHONPATH=.. timeout 200 python3 probe_mla_projection.py --out $OUT/probe-small.json --with-store --rounds 5 --layers 27 \
  --min-bs 1 --cases ${SMALL} --settings "${SETTINGS}" 2>&1 | tee $OUT/probe-small.log | cut -c1-600 | tail -8)
fi
rm -f $OUT/results.tgz $OUT/install.log $OUT/bench-table.txt
echo "$(date -u +%T) done"
