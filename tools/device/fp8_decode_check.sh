#!/usr/bin/env bash
# FP8 products in the serving regime (issue #22): batched decode steps on the e4m3 dense copies
# (CudaBackendOptions::prefill_fp8 with dense weights on) against the default kernels, 27B Q6_K
# synth, `deltaserve bench` at 16 / 32 / 40 / 64 streams (CONC). Each CONFIGS entry is one bench's extra
# flags ("-" = none); --fp8-decode-rows N (default 33; 0: never) sends decode steps of N+ rows to FP8.
# Here: DS_PACK_XZ=1 DS_PACK_BUILD=build-dev DS_PACK_OUT=.devcarry-f8d bash tools/device/pack.sh
# deltaserve; on the device: DS_CARRY=.devcarry-f8d [CONFIGS="...;..."] [CONC=1,16,64]
# bash tools/device/fp8_decode_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
M=/tmp/m.gguf
synth_27b "$M"
CONFIGS=${CONFIGS:-"-;--prefill-fp8 on --fp8-decode-rows 0;--prefill-fp8 on"}
IFS=';' read -ra cfgs <<<"$CONFIGS"
for c in "${cfgs[@]}"; do
  [ "$c" = "-" ] && c=""
  echo "== bench $c"
  t0=$SECONDS
  timeout 240 "$BIN/deltaserve" bench --model "$M" --prefill 512 --decode 16 --depth 0 \
    --conc "${CONC:-16,32,40,64}" --conc-gen 32 --no-profile $c 2>&1 |
    grep -E "memory plan|^(prefill|decode|aggregate)|error|Error|ignored" | head -10
  [ ${PIPESTATUS[0]} = 0 ] && pass "bench $c" || fail "bench $c"
  echo "   ($((SECONDS - t0)) s)"
done
exit $rc
