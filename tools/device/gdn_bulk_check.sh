#!/usr/bin/env bash
# The batched GDN decode with each head's state brought into shared memory by one bulk copy
# (issue #22, kernels/cuda/gdn.cu GdnDecodeKernel<..., kBulk>, `bench --gdn-bulk on|off`): its
# kernel test (bit for bit the register form) and the per-launch times of the 27B's layer at 16
# and 64 sequences in both forms, then `deltaserve bench` on the 27B Q6_K synth (one stream, x16,
# x64) with each setting, alternated, and the per-op-class profile of both at x16 / x64.
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-dev DS_PACK_OUT=.devcarry-lead bash tools/device/pack.sh \
#     deltaserve gdn_launch_cuda_test batch_invariance_test):
#   DS_CARRY=.devcarry-lead [ROUNDS=2] [FORMS="off on"] [PROFILE=1] \
#     bash tools/device/gdn_bulk_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
M=${MODEL:-/tmp/m.gguf}
synth_27b "$M" &
synth=$!
for t in ${TESTS:-gdn_launch_cuda_test batch_invariance_test}; do run_gtest $t; done
timeout 120 "$BIN/gdn_launch_cuda_test" --gtest_also_run_disabled_tests \
  --gtest_filter='GdnLaunchTiming.*' 2>&1 | grep "GDN decode"
wait $synth
for round in $(seq 1 "${ROUNDS:-2}"); do
  for f in ${FORMS:-off on}; do
    echo "== round $round --gdn-bulk $f"
    timeout 200 "$BIN/deltaserve" bench --model "$M" --prefill 512 --decode 16 --depth 0 \
      --conc ${CONC:-1,16,64} --conc-gen 32 --no-profile --gdn-bulk $f 2>&1 |
      grep -E "aggregate decode|decode tg" | sort -u
  done
done
if [ "${PROFILE:-1}" = 1 ]; then
  for f in ${FORMS:-off on}; do
    echo "== profile --gdn-bulk $f"
    timeout 200 "$BIN/deltaserve" bench --model "$M" --prefill 512 --decode 8 --depth 0 \
      --conc 16,64 --conc-gen 16 --gdn-bulk $f >"$L/prof_$f.log" 2>&1
    grep -E "gdn_core|aggregate decode" "$L/prof_$f.log" | head -12
  done
fi
exit $rc
