#!/usr/bin/env bash
# Early launch of the decode kernels (CudaBackendOptions::early_launch, kernels/cuda/README.md
# "Early launch of the decode kernels"): the GPU tests (gpu_vs_cpu_test compares it with plain
# launches; batch_invariance_test and mtp_gpu_test run with it, the default), then `deltaserve
# bench` on the 27B Q6_K synth with each switch set in MODES, alternated (decode 1 stream and
# x4), and the MTP rows (k = 3, 4) with it on and off.
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h3 DS_PACK_OUT=.devcarry-lead bash tools/device/pack.sh \
#     deltaserve gpu_vs_cpu_test batch_invariance_test mtp_gpu_test; a binary not packed is
#     skipped):
#   DS_CARRY=.devcarry-lead bash tools/device/early_launch_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
run_gtest gpu_vs_cpu_test
run_gtest batch_invariance_test
run_gtest mtp_gpu_test
M=${MODEL:-/tmp/m.gguf}
synth_27b "$M"
eval "modes=(${MODES:-\"--early-launch off\" \"--early-launch on\" \"--early-launch off\" \"--early-launch on\"})"
for f in "${modes[@]}"; do
  echo "== $f"
  timeout 200 "$BIN/deltaserve" bench --model "$M" --prefill 512 --decode 64 --depth 0 --conc ${CONC:-4} \
    --conc-gen 32 --no-profile $f 2>&1 | grep -E "^decode tg|^aggregate decode"
done
for f in "--early-launch off" "--early-launch on"; do
  echo "== MTP $f"
  timeout 200 "$BIN/deltaserve" bench --model "$M" --quick --mtp 3,4 --mtp-conc 1 --mtp-depth 512 $f 2>&1 |
    grep -E "^ k streams|^ [0-9] +[0-9]+ "
done
exit $rc
