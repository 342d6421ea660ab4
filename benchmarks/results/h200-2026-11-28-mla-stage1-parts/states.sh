# Issue 33, 2026-11-28 (stop 75): the read alone and the layers' probe in each graph state
# (BENCH_GRAPH_STATE: fast = an eager run after each capture, slow = a one-kernel capture after it).
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $OUT/device.txt
date -u +%FT%TZ >> $OUT/device.txt
git rev-parse --short HEAD >> $OUT/device.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/device.txt
cat $OUT/device.txt
for st in ${STATES:-fast slow}; do
if [ -n "$FCASES" ]; then
echo "$(date -u +%T) floor $st"
(cd benchmarks && BENCH_GRAPH_STATE=$st PYTHONPATH=.. timeout ${FLOOR_LIMIT:-200} python3 bench_mla_floor.py --out $OUT/floor-$st.json --splits '' \
  --cases $FCASES > $OUT/floor-$st.log 2>&1; tail -12 $OUT/floor-$st.log | cut -c1-260)
fi
if [ -n "$PCASES" ]; then
echo "$(date -u +%T) probe $st"
(cd benchmarks && BENCH_GRAPH_STATE=$st PYTHONPATH=.. timeout ${PROBE_LIMIT:-200} python3 probe_mla_projection.py --out $OUT/probe-$st.json --with-store --rounds ${ROUNDS:-3} --layers 27 \
  --cases $PCASES $PROBE_FLAGS > $OUT/probe-$st.log 2>&1; cut -c1-330 $OUT/probe-$st.log | tail -12)
fi
done
echo "$(date -u +%T) done"
