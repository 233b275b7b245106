#!/usr/bin/env bash
# Issue #15 on the device, one call: the batched CUDA MtpRows against MtpStep and the CPU
# (mtp_gpu_test), the MTP cost rows of `deltaserve bench --mtp` on the synthetic 27B Q6_K file
# (depth 512 at 1 and 16 streams, depth 4096 at 1), and end-to-end `generate` on the trained demo
# model with --mtp off vs 3 (tok/s and acceptance from --json).
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h3 DS_PACK_OUT=.devcarry-h3 bash tools/device/pack.sh \
#     mtp_gpu_test mtp_verify_bench deltaserve):
#   DS_CARRY=.devcarry-h3 bash tools/device/mtp_rows_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
LOG=${OUT:-/tmp}/mtp_rows; mkdir -p "$LOG"
M=/tmp/mtp_bench_27b.gguf
# The demo model's per-position acceptance (F16 weights, docs/quality.md, `deltaserve mtp-accept`).
ACCEPT=${ACCEPT:-0.574,0.493,0.478}
( timeout 200 "$BIN/mtp_verify_bench" --synth-only >"$LOG/synth.log" 2>&1 ) &
SYNTH=$!
t0=$SECONDS
timeout 200 "$BIN/mtp_gpu_test" --gtest_color=no >"$LOG/mtp_gpu_test.log" 2>&1
r=$?
echo "mtp_gpu_test: rc=$r in $((SECONDS - t0)) s; $(grep -E '^\[  (PASSED|FAILED)' "$LOG/mtp_gpu_test.log" | tr '\n' ' ')"
grep -E "^\[  FAILED  \]|Failure|Expected|Which is|mtp_gpu" "$LOG/mtp_gpu_test.log" | head -30
[ $r = 0 ] && pass mtp_gpu_test || fail mtp_gpu_test
# Demo model end to end (the plain and the MTP run alternate, twice each).
for rep in 1 2; do
  for mtp in off 3; do
    timeout 60 "$BIN/deltaserve" generate --model demo --backend cuda --max-tokens 256 \
      --prompt "The jury said that" --json --mtp $mtp >"$LOG/demo_${mtp}_$rep.json" 2>"$LOG/demo_${mtp}_$rep.err"
    r=$?
    echo "demo --mtp $mtp (run $rep): rc=$r $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("gen tok/s %.1f tokens %d mtp %s" % (d["generation_tokens_per_second"], d["generated_tokens"], json.dumps(d.get("mtp"))))' "$LOG/demo_${mtp}_$rep.json" 2>&1 | tail -1)"
    [ $r = 0 ] && pass "demo mtp $mtp" || { fail "demo mtp $mtp"; tail -3 "$LOG/demo_${mtp}_$rep.err"; }
  done
done
python3 - "$LOG" <<'PY'
import json, sys
d = {m: [json.load(open(f"{sys.argv[1]}/demo_{m}_{r}.json")) for r in (1, 2)] for m in ("off", "3")}
same = all(d["off"][i]["tokens"] == d["3"][i]["tokens"] for i in range(2))
print("demo: greedy tokens with --mtp 3 equal to --mtp off:", same)
for i in range(2):
  print("demo run %d: speed-up %.2fx" % (i + 1, d["3"][i]["generation_tokens_per_second"] / d["off"][i]["generation_tokens_per_second"]))
PY
wait $SYNTH; tail -1 "$LOG/synth.log"
timeout 120 "$BIN/deltaserve" bench --model "$M" --mtp 1,2,3 --mtp-accept "$ACCEPT" --mtp-conc 1,16 \
  --mtp-depth 512 2>&1 | tee "$LOG/bench512.log" | grep -v "^$" | tail -12
[ ${PIPESTATUS[0]} = 0 ] && pass "bench --mtp depth 512" || fail "bench --mtp depth 512"
timeout 90 "$BIN/deltaserve" bench --model "$M" --mtp 3 --mtp-accept "$ACCEPT" --mtp-conc 1 \
  --mtp-depth 4096 2>&1 | tee "$LOG/bench4096.log" | grep -v "^$" | tail -5
[ ${PIPESTATUS[0]} = 0 ] && pass "bench --mtp depth 4096" || fail "bench --mtp depth 4096"
exit $rc
