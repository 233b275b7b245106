#!/usr/bin/env bash
# One device call for issues #23 and #15 on one H200:
#  1. regression of the CUDA paths after the MTP / overlap changes: gpu_vs_cpu_test,
#     batch_invariance_test, paged_kv_gpu_test;
#  2. MTP through the whole cluster on CUDA: mtp_cluster_test with the worker on CUDA (--mtp 3,
#     demo model), tokens equal to plain `generate` on CUDA;
#  3. #23's target "one 200k-token request with q4_0 KV on one card together with 16 short ones":
#     `serve` of the 27B Q6_K synth file, q4_0 KV, 17 slots sharing a 240k-token pool; one
#     `deltactl load` of a 200,000-token prompt (32 new tokens) and one of 16 x 512-token prompts
#     (256 new tokens each) at the same time; every request must complete.
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h3 DS_PACK_OUT=.devcarry-lead tools/device/pack.sh deltaserve
#     deltactl mtp_cluster_test gpu_vs_cpu_test batch_invariance_test paged_kv_gpu_test):
#   DS_CARRY=.devcarry-lead bash tools/device/long_short_mtp_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp}/long_short; mkdir -p "$L"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
MODEL=${MODEL:-/tmp/m.gguf}
( [ -s "$MODEL" ] || "$BIN/deltaserve" gguf-synth --preset 27b --type Q6_K --out "$MODEL" >"$L/synth.log" 2>&1 ) &
SYNTH=$!
for t in gpu_vs_cpu_test batch_invariance_test paged_kv_gpu_test; do
  stamp "$t"
  timeout 120 "$BIN/$t" >"$L/$t.log" 2>&1; r=$?
  grep -E "^\[  PASSED|^\[  FAILED|Failure" "$L/$t.log" | head -6
  [ $r = 0 ] && pass "$t" || fail "$t rc=$r"
done
stamp "mtp_cluster_test on CUDA"
DS_DELTASERVE_BIN=$PWD/$BIN/deltaserve DS_CLUSTER_BACKEND=cuda timeout 150 "$BIN/mtp_cluster_test" \
  >"$L/mtp_cluster_test.log" 2>&1; r=$?
grep -E "^\[       OK|^\[  FAILED|Failure|Which is|tokens_per_step" "$L/mtp_cluster_test.log" | head -12
[ $r = 0 ] && pass "mtp_cluster_test (cuda)" || fail "mtp_cluster_test (cuda) rc=$r"
wait $SYNTH
stamp "serve 27B q4_0, 17 slots, 240k pool"
PORT=${PORT:-50160}
"$BIN/deltaserve" serve --model "$MODEL" --backend cuda --slots 17 --ctx 240000 --slot-cap 210000 \
  --split pool --kv-type q4_0 --kv-pool-tokens 240000 --port $PORT --nvml-device off \
  >"$L/serve.log" 2>&1 &
SERVE=$!
ready=0
wait_serving 127.0.0.1:$PORT $SERVE 150 && ready=1
[ $ready = 1 ] && pass "serve ready" || { fail "serve not ready"; tail -20 "$L/serve.log"; kill $SERVE; exit 1; }
grep -h "memory_plan" "$L/serve.log" | head -1 | cut -c1-700
stamp "load: 1 x 200k + 16 x 512"
s0=$SECONDS
"$BIN/deltactl" load --addr 127.0.0.1:$PORT --concurrency 1 --requests 1 --prompt-len 200000 \
  --max-tokens 32 --vocab 2000 --timeout ${LONG_TIMEOUT:-330} >"$L/long.txt" 2>&1 &
LONG=$!
sleep 2
"$BIN/deltactl" load --addr 127.0.0.1:$PORT --concurrency 16 --requests 16 --prompt-len 512 \
  --max-tokens 256 --vocab 2000 --timeout 330 >"$L/short.txt" 2>&1 &
SHORT=$!
while kill -0 $LONG 2>/dev/null || kill -0 $SHORT 2>/dev/null; do
  echo "t=$((SECONDS - s0)) s $("$BIN/deltactl" status --admin-addr 127.0.0.1:$((PORT + 1)) 2>&1 | grep -E "^queue|^context" | tr '\n' ' ')" >>"$L/status.txt"
  sleep 5
done
wait $LONG; rl=$?
wait $SHORT; rs=$?
echo "== 16 x 512 (rc $rs)"; tail -10 "$L/short.txt"
echo "== 1 x 200k (rc $rl), $((SECONDS - s0)) s after start"; tail -10 "$L/long.txt"
[ $rs = 0 ] && pass "16 x 512 beside the 200k request" || fail "16 x 512 rc=$rs"
[ $rl = 0 ] && pass "1 x 200k q4_0" || fail "1 x 200k rc=$rl"
echo "== status samples"; head -30 "$L/status.txt" | cut -c1-300
kill $SERVE; wait $SERVE 2>/dev/null
stamp "done"
exit $rc
