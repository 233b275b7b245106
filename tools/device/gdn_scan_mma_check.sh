#!/usr/bin/env bash
# The chunked GDN prefill scan on TF32 tensor cores (GdnPrefillArgs::scan_mma,
# CudaBackendOptions::gdn_scan_mma): the GDN kernels against the CPU reference with either scan
# (f32 and bf16 state), the one-layer timing of both scans (GdnTiming.DISABLED_Prefill27B), the
# whole-model checks, then `deltaserve bench` prefill rows with `--gdn-scan-mma off|on` and a
# profiled prefill (27B Q6_K synth).
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h3 DS_PACK_OUT=.devcarry-lead bash tools/device/pack.sh \
#     deltaserve gdn_cuda_test gpu_vs_cpu_test):
#   DS_CARRY=.devcarry-lead bash tools/device/gdn_scan_mma_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
run_gtest gdn_cuda_test --gtest_also_run_disabled_tests --gtest_filter='Gdn.*:GdnTiming.*'
grep -E "^GDN prefill|outputs mma" "$L/gdn_cuda_test.log"
grep -E "scan_mma" -A3 "$L/gdn_cuda_test.log" | grep -E "rel" | awk '{print $4}' | sort -g | tail -1 |
  sed 's/^/largest rel L2 with scan_mma: /'
[ "${GPU_VS_CPU:-1}" = 1 ] && run_gtest gpu_vs_cpu_test
M=${MODEL:-/tmp/m.gguf}
[ -s "$M" ] || timeout 200 "$BIN/deltaserve" gguf-synth --preset 27b --type Q6_K --out "$M" >/dev/null 2>&1
for f in off on off on; do
  echo "== --gdn-scan-mma $f"
  timeout 200 "$BIN/deltaserve" bench --model "$M" --prefill ${PREFILL:-512,8192,32768} --decode 8 \
    --depth 0 --conc "" --no-profile --gdn-scan-mma $f 2>&1 | grep -E "pp[0-9]+|prefill|tok/s" | head -8
done
echo "== prefill profile (per-op-class), --gdn-scan-mma on"
timeout 150 "$BIN/deltaserve" bench --model "$M" --prefill 8192 --decode 4 --depth 0 \
  --conc "" 2>&1 | grep -E "^prefill|prefill of|gdn_core|ffn|gdn_proj|attn_core|attn_proj|norm" | head -16
exit $rc
