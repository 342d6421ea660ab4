# Issue 33 / stop 74's lead, 2026-11-28 (stop 75): MoE and MLA decode graphs as shipped, and with no
# cuBLAS workspace and cgtool's dependent launches off, before and after prefill graphs.
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $OUT/device.txt
date -u +%FT%TZ >> $OUT/device.txt
git rev-parse --short HEAD >> $OUT/device.txt
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
for m in ${MODELS:-deepseek-v2-lite qwen3-30b-a3b}; do
  for way in shipped plain; do
    echo "$(date -u +%T) $m $way"
    if [ $way = plain ]; then export CUBLAS_WORKSPACE_CONFIG=:0:0 CGTOOL_DEPENDENT_LAUNCH=0; else unset CUBLAS_WORKSPACE_CONFIG CGTOOL_DEPENDENT_LAUNCH; fi
    (cd benchmarks && timeout -k 10 170 python3 probe_decode_after_prefill.py --model $m --out $OUT/$m-$way.json \
      --bs ${BS:-1,8,32} --captures tiny_kept,eager_same,prefill > $OUT/$m-$way.log 2>&1; grep "after" $OUT/$m-$way.log | cut -c1-140)
  done
done
unset CUBLAS_WORKSPACE_CONFIG CGTOOL_DEPENDENT_LAUNCH
echo "$(date -u +%T) done"
