nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $OUT/device.txt
date -u +%FT%TZ >> $OUT/device.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/device.txt
cat $OUT/device.txt
echo "$(date -u +%T) probe"
(cd benchmarks && PYTHONPATH=.. timeout 300 python3 probe_mla_projection.py --out $OUT/probe.json --with-store --rounds 5 --layers 27 \
  --cases ${CASES:-8x1024,16x1024,17x1024,24x1024,32x1024,48x1024,8x4096,16x2048,16x4096,40x300+1x16000} \
  --settings "${SETTINGS:-pf:PREFETCH=1;se:wg.SLOTS_EARLY=1;both:PREFETCH=1,wg.SLOTS_EARLY=1}" 2>&1 | tee $OUT/probe.log | cut -c1-400 | tail -12)
if [[ -n "${TESTS:-}" ]]; then
echo "$(date -u +%T) tests with ${FLIP}"
timeout 200 python3 -c "
import sys, pytest
import cgtool.attention.mla_merge_projection as m, cgtool.attention.gluon_mla_wgmma as g
${FLIP}
sys.exit(pytest.main(['-q', '-m', 'gpu', 'tests/test_mla_gpu.py']))" > $OUT/gpu-tests.log 2>&1
tail -2 $OUT/gpu-tests.log
fi
rm -f $OUT/results.tgz $OUT/install.log $OUT/bench-table.txt
echo "$(date -u +%T) done"
