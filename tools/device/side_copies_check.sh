#!/usr/bin/env bash
# The MTP cycle's copies beside the draft chain (CudaBackendOptions::side_copies) and the fused
# chain's call in its launch (MtpChainCall), issue #15: their GPU tests, then the demo's bench
# cycle with the side copies on and off alternated (one binary), then B's `generate` rounds and
# its kernel timeline (ab_host.sh without A).
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
for r in $(seq 1 "${ROUNDS:-3}"); do
  for side in on off; do
    echo "round $r --side-copies $side: $("$BIN/deltaserve" bench --model demo --quick --mtp "$K" --mtp-conc 1 \
      --mtp-depth 64 --no-profile --side-copies "$side" 2>&1 | grep -E "^ +$K +1 " | head -1)"
  done
done
"$BIN/deltaserve" bench --model demo --quick --mtp "$K" --mtp-conc 1 --mtp-depth 64 --no-profile 2>&1 |
  grep -E "cycle|chain|verify" | head -8
ROUNDS=${ROUNDS:-3} bash tools/device/ab_host.sh || rc=1
exit $rc
