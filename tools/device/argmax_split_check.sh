#!/usr/bin/env bash
# The split argmax (kernels/cuda/argmax.cuh) on the device: its tests against the CPU sampler
# (sampling_cuda_test), the timing loop (ArgmaxRows vs ArgmaxSplitRows, 1 / 4 / 32 rows at vocab
# 248,320), the paths that now use it (mtp_gpu_test: draft chains; gpu_vs_cpu_test: greedy decode
# sampled on the device), then `deltaserve bench` on the 27B Q6_K synth: decode at one stream with
# its per-op profile (the "sample" class) and MTP k=3 at one stream (the chain cycle).
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h3 DS_PACK_OUT=.devcarry-lead bash tools/device/pack.sh \
#     deltaserve sampling_cuda_test mtp_gpu_test gpu_vs_cpu_test):
#   DS_CARRY=.devcarry-lead bash tools/device/argmax_split_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp}/argmax_split; mkdir -p "$L"
MODEL=${MODEL:-/tmp/m.gguf}
( [ -s "$MODEL" ] || "$BIN/deltaserve" gguf-synth --preset 27b --type Q6_K --out "$MODEL" \
    >"$L/synth.log" 2>&1 ) &
SYNTH=$!
for t in sampling_cuda_test mtp_gpu_test gpu_vs_cpu_test; do run_gtest "$t"; done
timeout 120 "$BIN/sampling_cuda_test" --gtest_also_run_disabled_tests \
  --gtest_filter='*Timing*' 2>&1 | grep -E "Argmax|greedy" | head -12
wait $SYNTH
timeout 200 "$BIN/deltaserve" bench --model "$MODEL" --prefill 512 --decode 32 --depth 0 \
  --conc 4 --conc-gen 32 2>&1 | tee "$L/bench.log" | grep -E "decode|sample|tok/s" | head -30
timeout 200 "$BIN/deltaserve" bench --model "$MODEL" --prefill 512 --decode 32 --depth 0 \
  --conc "" --mtp 3 --mtp-conc 1 --mtp-depth 512 --no-profile 2>&1 | tee "$L/mtp.log" |
  grep -iE "mtp|cycle|verify|75" | head -30
exit $rc
