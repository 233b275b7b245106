#!/usr/bin/env bash
# The GDN recurrent state in bf16 on the CUDA backend (CudaBackendOptions::gdn_state_bf16): the
# GDN kernels against the CPU reference (f32 and bf16 storage), the whole-model checks, the demo
# model's perplexity on the GPU with either state (docs/quality.md), then `deltaserve bench`
# aggregate decode rows with `--gdn-state f32|bf16` alternated (27B Q6_K synth).
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h3 DS_PACK_OUT=.devcarry-lead bash tools/device/pack.sh \
#     deltaserve gdn_cuda_test spec_kernels_cuda_test gdn_launch_cuda_test gpu_vs_cpu_test
#   cp build/demo-data/heldout.txt .devcarry-lead/   # from tools/train/get_corpus.sh):
#   DS_CARRY=.devcarry-lead bash tools/device/gdn_bf16_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
# env.sh replaces the carry folder by the unpacked archive: the text goes aside first.
TEXT=${TEXT:-/tmp/heldout.txt}
[ -f "${DS_CARRY:-.devcarry}/heldout.txt" ] && cp "${DS_CARRY:-.devcarry}/heldout.txt" "$TEXT"
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
run_gtest gdn_cuda_test --gtest_filter='Gdn.*'
grep -E "bf16 elements" "$L/gdn_cuda_test.log" | sort | uniq -c | sort -rn | head -5
run_gtest spec_kernels_cuda_test
run_gtest gdn_launch_cuda_test
run_gtest gpu_vs_cpu_test
grep -E "gdn-state bf16" "$L/gpu_vs_cpu_test.log"
if [ -s "$TEXT" ]; then
  for ctx in 512 2048; do
    for st in f32 bf16; do
      echo "== perplexity demo --ctx $ctx --chunk 1 --gdn-state $st (cuda)"
      timeout 120 "$BIN/deltaserve" perplexity --model demo --text "$TEXT" --ctx $ctx --chunk 1 \
        --max-tokens 16384 --gdn-state $st --backend cuda --json 2>/dev/null | tail -1
    done
  done
fi
M=${MODEL:-/tmp/m.gguf}
synth_27b "$M"
for st in bf16 f32; do
  echo "== --gdn-state $st"
  timeout 150 "$BIN/deltaserve" bench --model "$M" --prefill 512 --decode 16 --depth 0 \
    --conc ${CONC:-16,64} --conc-gen 32 --no-profile --gdn-state $st 2>&1 |
    grep -E "^aggregate|^decode|^prefill|memory plan" | head -5
done
if [ "${PREFILL_PROFILE:-1}" = 1 ]; then
  echo "== prefill profile (per-op-class)"
  timeout 150 "$BIN/deltaserve" bench --model "$M" --prefill 512,8192 --decode 4 --depth 0 \
    --conc "" 2>&1 | grep -E "^prefill|prefill of|gdn_core|ffn|gdn_proj|attn_core" | head -16
fi
exit $rc
