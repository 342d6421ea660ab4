# Call 1 of this stop: the 128-column Gluon projection in the layers' probe, then whole decode steps.
set -o pipefail
PCASES=${PCASES:-16x1024,17x1024,24x1024,32x1024,8x4096,16x2048} \
PSETTINGS=${PSETTINGS:-"tr:GLUON_KERNEL=0;v128:BLOCK_V=128;v128r8:BLOCK_V=128,ROW_BLOCKS=8"} bash gpu-carry-mem/await.sh
if [ -n "$STEP" ]; then
  STEP_SETTINGS=${STEP_SETTINGS:-"tr:GLUON_KERNEL=0;v128r8:BLOCK_V=128,ROW_BLOCKS=8"} STEP_BS=${STEP_BS:-8,16,17,24,32,48,64} \
    bash scripts/gpu-check.sh mla-step > $OUT/step-phases.log 2>&1
  grep -E "^\[|bs " $OUT/step-phases.log | cut -c1-400
fi
echo "$(date -u +%T) all done"
