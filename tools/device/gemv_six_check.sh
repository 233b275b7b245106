#!/usr/bin/env bash
# A k = 4 MTP verify's 5-row steps on the launch-bound demo model (F16): the float-weight
# matmuls' 6-column kernel (CudaBackendOptions::gemv_six_columns, `bench --gemv-six on|off`).
# The kernel tests first (spec_kernels_cuda_test: GDN runs of 5 and 8 tokens bit for bit the
# chain's; kernels_cuda_test Gemv.*: a float column's products independent of the kernel width),
# then the demo's MTP cost rows with the switch alternated. Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-dev DS_PACK_OUT=.devcarry-ch bash tools/device/pack.sh deltaserve spec_kernels_cuda_test kernels_cuda_test):
#   DS_CARRY=.devcarry-ch bash tools/device/gemv_six_check.sh
# Knobs: ROUNDS (2), K (the drafts, 4).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
run_gtest spec_kernels_cuda_test
run_gtest kernels_cuda_test --gtest_filter='Gemv.*'
k=${K:-4}
for r in $(seq "${ROUNDS:-2}"); do
  for six in off on; do
    timeout 90 "$BIN/deltaserve" bench --model demo --quick --mtp "$k" --mtp-conc 1 --mtp-depth 64 \
      --no-profile --gemv-six "$six" >"$L/demo_${six}_$r.log" 2>&1
    echo "demo k=$k --gemv-six $six round $r: $(grep -E "^ $k +1 " "$L/demo_${six}_$r.log" | head -1)"
  done
done
exit $rc
