#!/usr/bin/env bash
# A verify's GDN runs with each token's prologue and epilogue in thread group c % groups
# (CudaBackendOptions::gdn_spread_run_tokens, issue #15): the kernel tests that check the spread
# run bit for bit (spec_kernels_cuda_test, gdn_launch_cuda_test) and mtp_gpu_test, then the demo's
# k = 4 verify step and chain cycle with `bench --gdn-spread on|off` alternated ROUNDS times
# (one binary), then `generate` with MTP off and at k = 4, 5, 6 (the default: spread).
# Here: DS_PACK_XZ=1 DS_PACK_BUILD=build-dev DS_PACK_OUT=.devcarry-jc bash tools/device/pack.sh \
#   deltaserve ds_kernel_timeline mtp_gpu_test spec_kernels_cuda_test gdn_launch_cuda_test
# On the device: DS_CARRY=.devcarry-jc [ROUNDS=2] bash tools/device/gdn_spread_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
for t in ${TESTS-spec_kernels_cuda_test gdn_launch_cuda_test mtp_gpu_test}; do run_gtest "$t"; done
for r in $(seq 1 "${ROUNDS:-2}"); do
  for cfg in on off; do
    timeout 120 "$BIN/deltaserve" bench --model demo --quick --mtp 4 --mtp-conc 1 --mtp-depth 64 \
      --no-profile --gdn-spread $cfg >"$L/b_$cfg.out" 2>&1 || fail "bench --gdn-spread $cfg"
    echo "round $r --gdn-spread $cfg: $(grep -E "^ +4 +1 " "$L/b_$cfg.out" | head -1 | tr -s ' ')"
  done
done
grep -B3 -E "^ +4 +1 " "$L/b_on.out" | head -4
demo_generate_rounds "${ROUNDS:-2}" off 4 5 6
exit $rc
