#!/usr/bin/env bash
# The f16 tensor-core matmul on wgmma (issue #22; CudaBackendOptions::f16_wgmma, kernels/cuda/
# tiled_f16.cu): its GPU tests (the activations' warpgroup order, the CPU reference at every
# column count, the mma.sync form's bits, every tiled format), the per-launch table with the
# wgmma columns, then `deltaserve bench` on the 27B Q6_K synth with `--f16-wgmma off|on`
# alternated. Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-dev DS_PACK_OUT=.devcarry-wg bash tools/device/pack.sh \
#     deltaserve tiled_f16_cuda_test tiled_formats_cuda_test):
#   DS_CARRY=.devcarry-wg [ROUNDS=2] [TABLE=1] [CONC=8,16,32,64] bash tools/device/f16_wgmma_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
M=${MODEL:-/tmp/m.gguf}
synth_27b "$M" &
synth=$!
run_gtest tiled_f16_cuda_test --gtest_filter='TiledF16Wgmma.*:TiledF16.*'
grep -E "^\[ +(OK|FAILED|SKIPPED) " "$L/tiled_f16_cuda_test.log" | head -20
run_gtest tiled_formats_cuda_test --gtest_filter='TiledFormats.Wgmma*:TiledFormats.EveryColumnCount*'
if [ "${TABLE:-1}" = 1 ]; then
  timeout 240 "$BIN/tiled_f16_cuda_test" --gtest_filter='TiledF16Timing.Table27B' \
    --gtest_color=no >"$L/table.log" 2>&1
  grep -A40 "^matrix" "$L/table.log" | grep -v '^\[' | head -40
fi
wait $synth
for round in $(seq 1 ${ROUNDS:-2}); do
  for f in off on; do
    echo "== round $round --f16-wgmma $f"
    timeout 200 "$BIN/deltaserve" bench --model "$M" --prefill 512 --decode 16 --depth 0 \
      --conc ${CONC:-8,16,32,64} --conc-gen 32 --no-profile --f16-wgmma $f 2>&1 |
      grep -E "aggregate decode|decode tg|prefill pp" | sort -u
  done
done
exit $rc
