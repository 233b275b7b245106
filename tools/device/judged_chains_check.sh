#!/usr/bin/env bash
# Deferred draft chains judged on the device (CudaBackendOptions::judged_chains, issue #15): the
# GPU tests that run them, then the demo's `generate` with MTP off, with --mtp 4 and with --mtp 4
# --judged-chains off, alternated (one binary), and the kernel timeline of one `generate --mtp 4`
# each way (where the host turnaround between the verify and its chain went).
# Here: DS_PACK_XZ=1 DS_PACK_BUILD=build-dev DS_PACK_OUT=.devcarry-jc bash tools/device/pack.sh \
#   deltaserve ds_kernel_timeline mtp_gpu_test
# On the device: DS_CARRY=.devcarry-jc [ROUNDS=3] [TESTS="mtp_gpu_test"] bash tools/device/judged_chains_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
for t in ${TESTS-mtp_gpu_test}; do run_gtest "$t"; done
demo_generate_rounds "${ROUNDS:-3}" off 4 "4 --judged-chains off"
if [ -f "$BIN/libds_kernel_timeline.so" ]; then
  for cfg in on off; do
    CUDA_INJECTION64_PATH=$(realpath "$BIN/libds_kernel_timeline.so") DS_TIMELINE_OUT=${OUT:-/tmp/out}/tl_judged_$cfg.txt \
      "$BIN/deltaserve" generate --model demo --backend cuda \
      --max-tokens 256 --prompt "The jury said that" --json --mtp 4 --judged-chains "$cfg" >/dev/null 2>&1
    echo "== timeline, --judged-chains $cfg"
    grep -E "^graph|^    (dev|host)" "${OUT:-/tmp/out}/tl_judged_$cfg.txt" | head -10
  done
fi
exit $rc
