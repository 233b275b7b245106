#!/usr/bin/env bash
# The GDN decode prologue over three thread groups (GdnDecodeArgs::spread_prologue, issue #22):
# gdn_launch_cuda_test (the batched forms bit for bit with and without it), its per-launch
# timing at 16 / 64 sequences, then `deltaserve bench` on the 27B Q6_K synth with
# `--gdn-spread off|on` alternated (ROUNDS, default 2). Here: DS_PACK_XZ=1 DS_PACK_BUILD=build-dev
# DS_PACK_OUT=.devcarry-sp bash tools/device/pack.sh deltaserve gdn_launch_cuda_test; on the
# device: DS_CARRY=.devcarry-sp [ROUNDS=2] [CONC=1,16,64] bash tools/device/gdn_spread_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
M=/tmp/m.gguf
synth_27b "$M" &
run_gtest gdn_launch_cuda_test
timeout 120 "$BIN/gdn_launch_cuda_test" --gtest_also_run_disabled_tests \
  --gtest_filter='GdnLaunchTiming.*' 2>&1 | grep "GDN decode"
wait
for r in $(seq 1 "${ROUNDS:-2}"); do
  for sw in off on; do
    echo "== round $r, --gdn-spread $sw"
    timeout 200 "$BIN/deltaserve" bench --model "$M" --prefill 512 --decode 16 --depth 0 \
      --conc "${CONC:-1,16,64}" --conc-gen 32 --no-profile --gdn-spread $sw 2>&1 |
      grep -E "^(decode|aggregate)|error|Error" | awk '!seen[$0]++'
    [ ${PIPESTATUS[0]} = 0 ] && pass "bench $sw" || fail "bench $sw"
  done
done
exit $rc
