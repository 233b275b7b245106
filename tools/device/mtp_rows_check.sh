#!/usr/bin/env bash
# Issue #15 on the device, one call: the batched CUDA MtpRows against MtpStep and the CPU
# (mtp_gpu_test), end-to-end `generate` on the trained demo model with --mtp off vs K (tok/s and
# acceptance from --json), and the MTP cost rows of `deltaserve bench --mtp` on the synthetic 27B
# Q6_K file (depth 512, and depth 4096 at one stream).
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h3 DS_PACK_OUT=.devcarry-h3 bash tools/device/pack.sh \
#     mtp_gpu_test mtp_verify_bench deltaserve):
#   DS_CARRY=.devcarry-h3 bash tools/device/mtp_rows_check.sh
# Knobs: DEMO_MTP="3" (K values run against off), DEMO_BENCH=1 (bench --mtp on the demo model
# too), BENCH512="--mtp 1,2,3 --mtp-conc 1,16", RUN_4096=1, ACCEPT (per-position rates).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
LOG=${OUT:-/tmp}/mtp_rows; mkdir -p "$LOG"
M=/tmp/mtp_bench_27b.gguf
# The demo model's per-position acceptance (F16 weights, docs/quality.md, `deltaserve mtp-accept`).
ACCEPT=${ACCEPT:-0.574,0.493,0.478}
DEMO_MTP=${DEMO_MTP:-3}
BENCH512=${BENCH512:---mtp 1,2,3 --mtp-conc 1,16}
# The synthetic 27B Q6_K file with an MTP block (mtp_verify_bench --synth-only, or the same preset
# through `deltaserve synth` when that binary was not packed).
if [ -x "$BIN/mtp_verify_bench" ]; then
  ( timeout 200 "$BIN/mtp_verify_bench" --synth-only >"$LOG/synth.log" 2>&1 ) &
else
  ( timeout 200 "$BIN/deltaserve" gguf-synth --preset 27b --out "$M" >"$LOG/synth.log" 2>&1 ) &
fi
SYNTH=$!
t0=$SECONDS
timeout 200 "$BIN/mtp_gpu_test" --gtest_color=no >"$LOG/mtp_gpu_test.log" 2>&1
r=$?
echo "mtp_gpu_test: rc=$r in $((SECONDS - t0)) s; $(grep -E '^\[  (PASSED|FAILED)' "$LOG/mtp_gpu_test.log" | tr '\n' ' ')"
grep -E "^\[  FAILED  \]|Failure|Expected|Which is|mtp_gpu" "$LOG/mtp_gpu_test.log" | head -30
[ $r = 0 ] && pass mtp_gpu_test || fail mtp_gpu_test
# Demo model end to end (plain and MTP runs alternate, twice each).
for rep in 1 2; do
  for mtp in off $DEMO_MTP; do
    timeout 60 "$BIN/deltaserve" generate --model demo --backend cuda --max-tokens 256 \
      --prompt "The jury said that" --json --mtp $mtp >"$LOG/demo_${mtp}_$rep.json" 2>"$LOG/demo_${mtp}_$rep.err"
    r=$?
    echo "demo --mtp $mtp (run $rep): rc=$r $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("gen tok/s %.1f tokens %d mtp %s" % (d["generation_tokens_per_second"], d["generated_tokens"], json.dumps(d.get("mtp"))))' "$LOG/demo_${mtp}_$rep.json" 2>&1 | tail -1)"
    [ $r = 0 ] && pass "demo mtp $mtp" || { fail "demo mtp $mtp"; tail -3 "$LOG/demo_${mtp}_$rep.err"; }
  done
done
python3 - "$LOG" $DEMO_MTP <<'PY'
import json, sys
log, ks = sys.argv[1], sys.argv[2:]
d = {m: [json.load(open(f"{log}/demo_{m}_{r}.json")) for r in (1, 2)] for m in ["off"] + ks}
for k in ks:
  same = all(d["off"][i]["tokens"] == d[k][i]["tokens"] for i in range(2))
  sp = ", ".join("%.2fx" % (d[k][i]["generation_tokens_per_second"] / d["off"][i]["generation_tokens_per_second"]) for i in range(2))
  print("demo --mtp %s: tokens equal to --mtp off: %s; speed-up per run: %s" % (k, same, sp))
PY
if [ "${DEMO_BENCH:-0}" = 1 ]; then
  timeout 60 "$BIN/deltaserve" bench --model demo --mtp 1,3 --mtp-accept 0.645,0.9,0.889 \
    --mtp-depth 64 2>&1 | tee "$LOG/bench_demo.log" | grep -v "^$" | tail -6
  [ ${PIPESTATUS[0]} = 0 ] && pass "bench --mtp demo" || fail "bench --mtp demo"
fi
wait $SYNTH; tail -1 "$LOG/synth.log"
timeout 120 "$BIN/deltaserve" bench --model "$M" $BENCH512 --mtp-accept "$ACCEPT" \
  --mtp-depth 512 2>&1 | tee "$LOG/bench512.log" | grep -v "^$" | tail -12
[ ${PIPESTATUS[0]} = 0 ] && pass "bench --mtp depth 512" || fail "bench --mtp depth 512"
if [ "${RUN_4096:-1}" = 1 ]; then
  timeout 90 "$BIN/deltaserve" bench --model "$M" --mtp 3 --mtp-accept "$ACCEPT" --mtp-conc 1 \
    --mtp-depth 4096 2>&1 | tee "$LOG/bench4096.log" | grep -v "^$" | tail -5
  [ ${PIPESTATUS[0]} = 0 ] && pass "bench --mtp depth 4096" || fail "bench --mtp depth 4096"
fi
exit $rc
