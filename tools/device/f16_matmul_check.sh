#!/usr/bin/env bash
# A/B of a switch of the f16 tensor-core matmul (issue #22, kernels/cuda/tiled_f16.cu): its
# kernel tests, the timing table (default and scratch columns), the whole-model /
# batch-invariance tests, then `deltaserve bench` x16 / x64 on the 27B Q6_K synth with the switch
# $AB (default --f16-cluster: the K split's clusters) on / off, alternated.
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h3 DS_PACK_OUT=.devcarry-lead bash tools/device/pack.sh \
#     deltaserve tiled_f16_cuda_test batch_invariance_test gpu_vs_cpu_test):
#   DS_CARRY=.devcarry-lead [AB=--f16-cluster] [ROUNDS=2] [BF16=1] bash tools/device/f16_matmul_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
M=${MODEL:-/tmp/m.gguf}
AB=${AB:---f16-cluster}
synth_27b "$M" &
synth=$!
run_gtest tiled_f16_cuda_test
grep -E "^\[ +(OK|FAILED|SKIPPED) " "$L/tiled_f16_cuda_test.log" | head -20
timeout 200 "$BIN/tiled_f16_cuda_test" --gtest_also_run_disabled_tests --gtest_filter='TiledF16Timing.Table27B' \
  --gtest_color=no >"$L/table.log" 2>&1
grep -A36 "^matrix" "$L/table.log"
for t in batch_invariance_test gpu_vs_cpu_test; do run_gtest $t; done
wait $synth
for round in $(seq 1 ${ROUNDS:-2}); do
  for f in on off; do
    echo "== round $round $AB $f"
    timeout 200 "$BIN/deltaserve" bench --model "$M" --prefill 512 --decode 16 --depth 0 --conc ${CONC:-16,64} \
      --conc-gen 32 --no-profile $AB $f 2>&1 | grep -E "aggregate decode|decode tg" | sort -u
  done
done
[ "${BF16:-1}" = 1 ] && { echo "== --gdn-state bf16"
timeout 200 "$BIN/deltaserve" bench --model "$M" --prefill 512 --decode 16 --depth 0 --conc ${CONC:-16,64} \
  --conc-gen 32 --no-profile --gdn-state bf16 2>&1 | grep -E "aggregate decode|decode tg" | sort -u; }
exit $rc
