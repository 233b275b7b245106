#!/usr/bin/env bash
# The coarse draft head (kernels/cuda/draft_head.cuh, CudaBackendOptions::coarse_draft_head): its
# kernel test and the MTP tests, then `deltaserve bench --mtp` on the 27B Q6_K synth with the
# switch off and on, alternated (the MTP cost rows: verify, MtpStep, chain cycle, tok/s at 75%).
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h3 DS_PACK_OUT=.devcarry-lead bash tools/device/pack.sh \
#     deltaserve draft_head_cuda_test mtp_gpu_test):
#   DS_CARRY=.devcarry-lead bash tools/device/draft_head_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
run_gtest draft_head_cuda_test
run_gtest mtp_gpu_test
grep "coarse draft head:" "$L/mtp_gpu_test.log"
M=${MODEL:-/tmp/m.gguf}
synth_27b "$M"
for r in 1 2; do
  for f in off on; do
    echo "== --coarse-draft-head $f (round $r)"
    timeout 200 "$BIN/deltaserve" bench --model "$M" --quick --mtp ${MTP_K:-3,4} --mtp-conc 1 \
      --mtp-depth 512 --coarse-draft-head $f 2>&1 | grep -E "^ k streams|^ [0-9] +[0-9]+ |memory plan"
  done
done
exit $rc
