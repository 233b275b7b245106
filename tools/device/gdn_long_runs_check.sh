#!/usr/bin/env bash
# The GDN run kernel's chunk for runs longer than 4 tokens (CudaBackendOptions::gdn_long_run_chunk,
# a k = 4 verify's 5-token runs): spec_kernels_cuda_test (every chunk length bit for bit the
# chain's), then the MTP cost rows of the demo model and of the 27B Q6_K synth with
# `bench --gdn-long-runs 4|5|8`, alternated. Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-dev DS_PACK_OUT=.devcarry-ch bash tools/device/pack.sh deltaserve spec_kernels_cuda_test):
#   DS_CARRY=.devcarry-ch bash tools/device/gdn_long_runs_check.sh
# Knobs: ROUNDS (2), CHUNKS ("4 5 8"), BIG=0 skips the 27B rows.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
CHUNKS=${CHUNKS:-4 5 8}
if [ "${BIG:-1}" = 1 ]; then
  ( timeout 200 "$BIN/deltaserve" gguf-synth --preset 27b --type Q6_K --out /tmp/m.gguf >"$L/synth.log" 2>&1 ) &
fi
[ -x "$BIN/spec_kernels_cuda_test" ] && run_gtest spec_kernels_cuda_test
row() { grep -E "^ 4 +1 " "$1" | head -1; }
for r in $(seq "${ROUNDS:-2}"); do
  for c in $CHUNKS; do
    timeout 90 "$BIN/deltaserve" bench --model demo --quick --mtp 4 --mtp-conc 1 --mtp-depth 64 \
      --no-profile --gdn-long-runs "$c" >"$L/demo_${c}_$r.log" 2>&1
    echo "demo k=4 chunk $c round $r: $(row "$L/demo_${c}_$r.log")"
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
