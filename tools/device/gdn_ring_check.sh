#!/usr/bin/env bash
# The GDN decode's state ring (GdnDecodeArgs::state_ring, `bench --gdn-ring`, issue #22): its
# test (bit for bit the register form) and the per-launch timing of the three forms, then the
# 27B Q6_K synth's batched decode with the ring off / on alternated (and any other CONFIGS).
# Here: DS_PACK_XZ=1 DS_PACK_BUILD=build-dev DS_PACK_OUT=.devcarry-ring bash tools/device/pack.sh
# deltaserve gdn_launch_cuda_test [...]; on the device: DS_CARRY=.devcarry-ring
# [CONFIGS="-;--gdn-ring on"] [CONC=16,64] [ROUNDS=2] bash tools/device/gdn_ring_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs; mkdir -p "$L"
M=/tmp/m.gguf
( synth_27b "$M" ) &
run_gtest gdn_launch_cuda_test
timeout 120 "$BIN/gdn_launch_cuda_test" --gtest_also_run_disabled_tests \
  --gtest_filter='GdnLaunchTiming.*' 2>&1 | grep -E "^GDN decode"
wait
CONFIGS=${CONFIGS:-"-;--gdn-ring on"}
IFS=';' read -ra cfgs <<<"$CONFIGS"
for round in $(seq "${ROUNDS:-2}"); do
  for c in "${cfgs[@]}"; do
    [ "$c" = "-" ] && c=""
    echo "== round $round: bench $c"
    timeout 200 "$BIN/deltaserve" bench --model "$M" --prefill 512 --decode 16 --depth 0 \
      --conc "${CONC:-16,64}" --conc-gen 32 --no-profile $c 2>&1 |
      grep -E "^(decode|aggregate)|error|Error" | head -6
    [ ${PIPESTATUS[0]} = 0 ] && pass "bench $c" || fail "bench $c"
  done
done
exit $rc
