#!/usr/bin/env bash
# A k = 4 MTP verify's 5-row steps: the GDN run kernel's chunk for runs longer than 4 tokens
# (CudaBackendOptions::gdn_long_run_chunk, `bench --gdn-long-runs 4|5|8`) and the float-weight
# matmuls' 6-column kernel (gemv_six_columns, `bench --gemv-six on|off`). The kernel tests first
# (spec_kernels_cuda_test: every chunk length bit for bit the chain's; kernels_cuda_test: a float
# column's products independent of the kernel width), then the MTP cost rows of the demo model
# (F16: both knobs) and of the 27B Q6_K synth (tiled: the chunk only), variants alternated.
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-dev DS_PACK_OUT=.devcarry-ch bash tools/device/pack.sh deltaserve spec_kernels_cuda_test kernels_cuda_test):
#   DS_CARRY=.devcarry-ch bash tools/device/gdn_long_runs_check.sh
# Knobs: ROUNDS (2), DEMO ("4:off 4:on 5:on 8:on", chunk:six), CHUNKS ("4 5 8", the 27B), BIG=0
# skips the 27B rows.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
CHUNKS=${CHUNKS:-4 5 8}
if [ "${BIG:-1}" = 1 ]; then
  ( timeout 200 "$BIN/deltaserve" gguf-synth --preset 27b --type Q6_K --out /tmp/m.gguf >"$L/synth.log" 2>&1 ) &
fi
run_gtest spec_kernels_cuda_test
run_gtest kernels_cuda_test --gtest_filter='Gemv.*'
row() { grep -E "^ 4 +1 " "$1" | head -1; }
for r in $(seq "${ROUNDS:-2}"); do
  for v in ${DEMO:-4:off 4:on 5:on 8:on}; do
    c=${v%%:*} six=${v##*:}
    timeout 90 "$BIN/deltaserve" bench --model demo --quick --mtp 4 --mtp-conc 1 --mtp-depth 64 \
      --no-profile --gdn-long-runs "$c" --gemv-six "$six" >"$L/demo_${c}_${six}_$r.log" 2>&1
    echo "demo k=4 chunk $c six $six round $r: $(row "$L/demo_${c}_${six}_$r.log")"
  done
done
if [ "${BIG:-1}" = 1 ]; then
  wait
  tail -1 "$L/synth.log"
  for r in $(seq "${ROUNDS:-2}"); do
    for c in $CHUNKS; do
      timeout 150 "$BIN/deltaserve" bench --model /tmp/m.gguf --quick --mtp 4 --mtp-conc 1 \
        --mtp-depth 512 --no-profile --gdn-long-runs "$c" >"$L/big_${c}_$r.log" 2>&1
      echo "27B k=4 chunk $c round $r: $(row "$L/big_${c}_$r.log")"
    done
  done
fi
exit $rc
