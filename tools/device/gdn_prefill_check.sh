#!/usr/bin/env bash
# The chunked GDN prefill (issue #22) on the device in one call: gdn_cuda_test (against the CPU
# recurrence), kernels_cuda_test, gpu_vs_cpu_test, the chunk kernels' times under ncu (the
# 1,024-token case of Gdn.ChunkedPrefill), then `deltaserve bench` on the 27B Q6_K synth:
# the op-class profile of a 512- and an 8,192-token prefill and the prefill rows with dense
# weights on and off.
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h3 DS_PACK_OUT=.devcarry-lead bash tools/device/pack.sh \
#     deltaserve gdn_cuda_test kernels_cuda_test gpu_vs_cpu_test):
#   DS_CARRY=.devcarry-lead bash tools/device/gdn_prefill_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
M=/tmp/m.gguf
timeout 200 "$BIN/gdn_cuda_test" >/tmp/gdn.log 2>&1 && pass gdn_cuda_test || fail gdn_cuda_test
grep -E "gdn (prefill|state)" /tmp/gdn.log | sort -k4 -g | tail -2
timeout 200 "$BIN/kernels_cuda_test" >/tmp/kernels.log 2>&1 && pass kernels_cuda_test || fail kernels_cuda_test
timeout 200 "$BIN/gpu_vs_cpu_test" >/tmp/gpu_vs_cpu.log 2>&1 && pass gpu_vs_cpu_test || fail gpu_vs_cpu_test
if [ -x /usr/local/cuda/bin/ncu ]; then
  /usr/local/cuda/bin/ncu -k 'regex:GdnChunkScan|GdnChunkPrep' --launch-skip 10 -c 2 --metrics gpu__time_duration.sum \
    "$BIN/gdn_cuda_test" --gtest_filter=Gdn.ChunkedPrefill 2>&1 | grep -E "GdnChunk.*Kernel|duration" | paste - -
fi
synth_27b "$M"
timeout 300 "$BIN/deltaserve" bench --model "$M" --prefill 512,8192 --decode 8 --depth 0 --dense-weights on 2>&1 |
  grep -E -A10 "prefill of (512|8192) tokens"
for dense in on off; do
  echo "== --dense-weights $dense"
  timeout 300 "$BIN/deltaserve" bench --model "$M" --prefill 512,2048,8192 --decode 8 --depth 0 --dense-weights $dense --no-profile 2>&1 |
    grep -A5 "bench summary"
done
exit $rc
