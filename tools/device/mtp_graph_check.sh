#!/usr/bin/env bash
# Issue #15 on the device, one call: the graph-captured verify steps and the greedy draft chain
# (MtpDraftGreedy) — kernel tests (spec_kernels_cuda_test: device-resident masked attention,
# MTP mask update), mtp_gpu_test (verify replayed from graphs bit-identical to decoding the kept
# tokens; draft chain = host drafts), the regression suites (gpu_vs_cpu_test,
# batch_invariance_test), then mtp_rows_check.sh (demo end to end --mtp off vs K, bench --mtp on
# the demo model and the synthetic 27B with the draft-chain cycle column).
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h3 DS_PACK_OUT=.devcarry-lead bash tools/device/pack.sh \
#     spec_kernels_cuda_test mtp_gpu_test gpu_vs_cpu_test batch_invariance_test \
#     mtp_verify_bench deltaserve):
#   DS_CARRY=.devcarry-lead bash tools/device/mtp_graph_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
LOG=${OUT:-/tmp}/mtp_graph; mkdir -p "$LOG"
for t in ${TESTS:-spec_kernels_cuda_test gpu_vs_cpu_test batch_invariance_test}; do
  t0=$SECONDS
  timeout 200 "$BIN/$t" --gtest_color=no >"$LOG/$t.log" 2>&1
  r=$?
  echo "$t: rc=$r in $((SECONDS - t0)) s; $(grep -E '^\[  (PASSED|FAILED)' "$LOG/$t.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]|Failure|Expected|Which is" "$LOG/$t.log" | head -10
  [ $r = 0 ] && pass "$t" || fail "$t"
done
OUT_SAVE=${OUT:-/tmp}
DEMO_MTP=${DEMO_MTP:-"2 3"} DEMO_BENCH=1 RUN_4096=${RUN_4096:-1} \
  BENCH512=${BENCH512:---mtp 1,3 --mtp-conc 1,4} bash tools/device/mtp_rows_check.sh
r=$?
[ $r = 0 ] || rc=1
exit $rc
