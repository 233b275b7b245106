#!/usr/bin/env bash
# The chunked GDN prefill scan on TF32 tensor cores (GdnPrefillArgs::scan_mma,
# CudaBackendOptions::gdn_scan_mma) and the conv prefill kernel's token runs: the GDN kernels
# against the CPU reference with either scan (f32 and bf16 state), the one-layer timing of both
# scans (GdnTiming.DISABLED_Prefill27B) and its kernels under ncu (real clocks), the whole-model
# checks, then `deltaserve bench` prefill rows with `--gdn-scan-mma off|on` alternated and (FILL=1)
# the 190k-token q4_0 fill (27B Q6_K synth).
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h3 DS_PACK_OUT=.devcarry-lead bash tools/device/pack.sh \
#     deltaserve gdn_cuda_test gpu_vs_cpu_test batch_invariance_test):
#   DS_CARRY=.devcarry-lead bash tools/device/gdn_scan_mma_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
run_gtest gdn_cuda_test --gtest_also_run_disabled_tests --gtest_filter='Gdn.*:GdnTiming.*'
grep -E "^GDN prefill|outputs mma" "$L/gdn_cuda_test.log"
G="$BIN/gdn_cuda_test --gtest_also_run_disabled_tests --gtest_filter=GdnTiming.*"
# Kernels of one T=8192 layer, f32 scan then mma scan (the test's launches 132.. and 198..).
for skip in 132 198; do
  /usr/local/cuda/bin/ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum \
    --launch-skip $skip --launch-count 6 $G 2>&1 | grep -E "^  [a-z].*\(|gpu__time" |
    awk '/time/{print prev" "$(NF-1)" "$NF} {prev=substr($0,1,64)}'
done
run_gtest gpu_vs_cpu_test
run_gtest batch_invariance_test
M=${MODEL:-/tmp/m.gguf}
synth_27b "$M"
for f in off on off on; do
  echo "== --gdn-scan-mma $f"
  timeout 200 "$BIN/deltaserve" bench --model "$M" --prefill ${PREFILL:-512,8192,32768} --decode 8 \
    --depth 0 --conc "" --no-profile --gdn-scan-mma $f 2>&1 | grep -E "^prefill pp" | head -3
done
if [ "${FILL:-0}" = 1 ]; then
  echo "== 190k q4_0 fill"
  timeout 240 "$BIN/deltaserve" bench --model "$M" --prefill 512 --decode 16 --depth 190000 \
    --kv-type q4_0 --conc "" --no-profile 2>&1 | grep -E "filled|decode|memory plan" | head -8
fi
exit $rc
