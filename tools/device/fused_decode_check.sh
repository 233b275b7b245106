#!/usr/bin/env bash
# Fewer launches per decode step (issues #22 / #15): the GDN kernel's int8 output, QkvPrep over
# heads, the MTP pass's q/k/v and gate/up in one launch each. GPU tests, then `deltaserve bench` on the 27B Q6_K synth with --fuse-gdn on / off (decode x1 / x16 / x64
# and the MTP k=3 cycle) in one call.
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h3 DS_PACK_OUT=.devcarry-lead bash tools/device/pack.sh \
#     deltaserve gdn_launch_cuda_test kernels_cuda_test kv_quant_cuda_test mtp_gpu_test \
#     gpu_vs_cpu_test spec_kernels_cuda_test):
#   DS_CARRY=.devcarry-lead bash tools/device/fused_decode_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
for t in gdn_launch_cuda_test kv_quant_cuda_test mtp_gpu_test gpu_vs_cpu_test kernels_cuda_test spec_kernels_cuda_test; do
  run_gtest $t
done
M=${MODEL:-/tmp/m.gguf}
synth_27b "$M"
for f in on off on; do
  echo "== --fuse-gdn $f"
  timeout 200 "$BIN/deltaserve" bench --model "$M" --prefill 512 --decode 32 --depth 0 --conc 16,64 --conc-gen 32 \
    --no-profile --fuse-gdn $f 2>&1 | grep -A7 "bench summary" | tail -6
  timeout 200 "$BIN/deltaserve" bench --model "$M" --prefill 512 --decode 32 --depth 0 --no-profile --quick \
    --fuse-gdn $f --mtp 3 --mtp-conc 1 --mtp-depth 512 2>&1 | grep -E -A1 "^ k streams"
done
exit $rc
