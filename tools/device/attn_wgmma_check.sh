#!/usr/bin/env bash
# The wgmma prefill attention (kernels/cuda/attention_prefill_wgmma.cu,
# CudaBackendOptions::attn_prefill_wgmma): the attention kernel tests (every KV type and shape
# against the double reference, the wgmma kernel beside the mma.sync one) and the whole-model
# GPU-vs-CPU checks, the kernels' timing at a 4,096-token chunk after 0 / 28,672 / 126,976 cached
# tokens, then (unless BENCH=0) `deltaserve bench` prefill rows with `--attn-wgmma off|on` and the
# 190k-token q4_0 fill with it on (27B Q6_K synth); with CONC=16,64 also aggregate decode rows.
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h3 DS_PACK_OUT=.devcarry-lead bash tools/device/pack.sh \
#     deltaserve kv_quant_cuda_test gpu_vs_cpu_test):
#   DS_CARRY=.devcarry-lead bash tools/device/attn_wgmma_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
run_gtest kv_quant_cuda_test
grep -E "wgmma|tensor cores" "$L/kv_quant_cuda_test.log" | head -60
run_gtest gpu_vs_cpu_test
timeout 120 "$BIN/kv_quant_cuda_test" --gtest_also_run_disabled_tests \
  --gtest_filter='KvQuantTiming.DISABLED_Prefill27B' 2>&1 | grep -E "prefill attention|OK|FAILED"
[ "$rc" = 0 ] || exit $rc
[ "${BENCH:-1}" = 0 ] && exit $rc
M=${MODEL:-/tmp/m.gguf}
synth_27b "$M"
for f in off on; do
  echo "== --attn-wgmma $f"
  timeout 150 "$BIN/deltaserve" bench --model "$M" --prefill ${PREFILL:-8192,32768} --decode 8 \
    --depth 0 --conc "" --no-profile --attn-wgmma $f 2>&1 | grep -E "pp[0-9]+|prefill|tok/s" | head -8
done
if [ "${FILL:-1}" = 1 ]; then
  echo "== 190k q4_0 fill, --attn-wgmma ${FILL_WGMMA:-on}"
  timeout 200 "$BIN/deltaserve" bench --model "$M" --prefill 512 --decode 16 --depth 190000 \
    --kv-type q4_0 --conc "" --no-profile --attn-wgmma ${FILL_WGMMA:-on} 2>&1 |
    grep -E "filled|decode|memory plan" | head -8
fi
if [ -n "${CONC:-}" ]; then
  echo "== aggregate decode --conc $CONC"
  timeout 200 "$BIN/deltaserve" bench --model "$M" --prefill 512 --decode 32 --depth 0 \
    --conc "$CONC" --conc-gen 32 --no-profile 2>&1 | grep -E "conc|x[0-9]+|streams" | head -8
fi
exit $rc
