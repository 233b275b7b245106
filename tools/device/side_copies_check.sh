#!/usr/bin/env bash
# The MTP cycle's copies beside the draft chain (CudaBackendOptions::side_copies), the fused
# chain's call in its launch (MtpChainCall) and the float GEMV's early weights
# (CudaBackendOptions::gemv_early_weights), issue #15: their GPU tests, then the demo's bench
# (plain decode and the MTP cycle) with the defaults, the side copies off and the early weights
# off alternated (one binary), then `generate` rounds and its kernel timeline (ab_host.sh, B only).
# Here: DS_PACK_XZ=1 DS_PACK_BUILD=build-dev DS_PACK_OUT=.devcarry-sc bash tools/device/pack.sh \
#   deltaserve ds_kernel_timeline mtp_gpu_test batch_invariance_test spec_kernels_cuda_test gpu_vs_cpu_test
# On the device: DS_CARRY=.devcarry-sc [ROUNDS=3] bash tools/device/side_copies_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
for t in ${TESTS:-mtp_gpu_test batch_invariance_test spec_kernels_cuda_test gpu_vs_cpu_test}; do
  run_gtest "$t"
done
K=${K:-4}
# Each round: the defaults, the side copies off, the float GEMV's early weights off.
for r in $(seq 1 "${ROUNDS:-3}"); do
  for cfg in "" "--side-copies off" "--gemv-early-weights off"; do
    "$BIN/deltaserve" bench --model demo --quick --mtp "$K" --mtp-conc 1 --mtp-depth 64 --no-profile \
      $cfg >"$L/bench.out" 2>&1
    echo "round $r [${cfg:-defaults}]: $(grep -E "^ +$K +1 " "$L/bench.out" | head -1 | tr -s ' ') |" \
      "$(grep -E "^decode tg" "$L/bench.out" | head -1 | tr -s ' ')"
  done
done
"$BIN/deltaserve" bench --model demo --quick --mtp "$K" --mtp-conc 1 --mtp-depth 64 --no-profile 2>&1 |
  grep -E "cycle|chain|verify" | head -8
ROUNDS=${GEN_ROUNDS:-${ROUNDS:-3}} bash tools/device/ab_host.sh || rc=1
exit $rc
