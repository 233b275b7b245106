#!/usr/bin/env bash
# Attention on tensor cores (kernels/cuda/attention_mma.cu decode, attention_prefill_mma.cu
# prefill) on the device in one call: their CPU-reference tests beside the SIMT / cuBLAS paths'
# (kv_quant_cuda_test), the decode kernel alone at 32k and 192k (KvQuantTiming), the whole-model
# checks that run them (gpu_vs_cpu_test, batch_invariance_test, mtp_gpu_test), then the 27B Q6_K
# synth end to end with tensor cores on and off: pp512 / pp32768 and decode at depth 32768 with
# q4_0 KV, and the short-context rows.
# Logs in /tmp/attn_mma on the device.
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h3 DS_PACK_OUT=.devcarry-lead bash tools/device/pack.sh \
#     deltaserve kv_quant_cuda_test gpu_vs_cpu_test batch_invariance_test mtp_gpu_test):
#   DS_CARRY=.devcarry-lead bash tools/device/attn_mma_check.sh
# SKIP_TESTS=1 runs the benches only; DEPTHS="32768 131072" sets the end-to-end depths.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
LOG=/tmp/attn_mma; mkdir -p "$LOG"
M=/tmp/m.gguf
( timeout 200 "$BIN/deltaserve" gguf-synth --preset 27b --type Q6_K --out "$M" >"$LOG/synth.log" 2>&1 ) &
SYNTH=$!
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  for t in kv_quant_cuda_test gpu_vs_cpu_test batch_invariance_test mtp_gpu_test; do
    [ -x "$BIN/$t" ] || { echo "skip $t (not packed)"; continue; }
    t0=$SECONDS
    timeout 300 "$BIN/$t" --gtest_color=no >"$LOG/$t.log" 2>&1
    r=$?
    echo "$t: rc=$r in $((SECONDS - t0)) s; $(grep -E '^\[  (PASSED|FAILED)' "$LOG/$t.log" | tr '\n' ' ')"
    grep -E "^\[  FAILED  \]|Failure" "$LOG/$t.log" | head -8
    [ $r = 0 ] && pass "$t" || fail "$t"
  done
  grep -E "tensor cores: rel" "$LOG/kv_quant_cuda_test.log" | sort -k9 -g | tail -3
fi
[ -x "$BIN/kv_quant_cuda_test" ] && timeout 200 "$BIN/kv_quant_cuda_test" --gtest_color=no \
  --gtest_also_run_disabled_tests --gtest_filter='KvQuantTiming.*' 2>&1 | grep "decode attention"
wait "$SYNTH"; tail -1 "$LOG/synth.log"
for depth in ${DEPTHS:-32768}; do
  for mma in on off; do
    timeout 300 "$BIN/deltaserve" bench --model "$M" --prefill 512,32768 --decode 32 --depth "$depth" \
      --conc "" --kv-type q4_0 --attn-mma $mma --no-profile >"$LOG/bench_${depth}_$mma.log" 2>&1
    r=$?
    echo "depth $depth, attn-mma $mma: $(grep -E "^(prefill|decode)" "$LOG/bench_${depth}_$mma.log" | sort -u | tr -s ' ' | tr '\n' ';')"
    [ $r = 0 ] && pass "bench depth $depth attn-mma $mma" || fail "bench depth $depth attn-mma $mma (rc=$r)"
  done
done
if [ "${SHORT:-1}" = 1 ]; then
  timeout 300 "$BIN/deltaserve" bench --model "$M" --prefill 512 --decode 32 --depth 0 --conc 4,16 \
    --conc-gen 32 --no-profile >"$LOG/bench.log" 2>&1
  r=$?
  grep -E "^(prefill|decode|aggregate)" "$LOG/bench.log" | tail -4
  [ $r = 0 ] && pass "bench" || fail "bench (rc=$r)"
  timeout 300 "$BIN/deltaserve" bench --model "$M" --mtp 3 --mtp-conc 1 --mtp-depth 512 >"$LOG/bench_mtp.log" 2>&1
  r=$?
  grep -E "^ *k streams|^ *3 " "$LOG/bench_mtp.log"
  [ $r = 0 ] && pass "bench --mtp 3" || fail "bench --mtp 3 (rc=$r)"
fi
exit $rc
