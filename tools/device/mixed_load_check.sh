#!/usr/bin/env bash
# Issue #23's shared-pool target on one H200: `serve` of the 27B Q6_K file with 64 slots sharing a
# 2M-token q8_0 KV pool (--ctx 2000000 --slot-cap 131072 --kv-pool-tokens 2000000), driven by two
# `deltactl load`s at once: 60 streams of 512-token prompts
# generating 1024 tokens each while 4 streams of 100k-token prompts prefill and generate 32.
# Every request must complete; `deltactl status` is sampled while they run.
# Usage (device, repo root, packed deltaserve + deltactl): bash tools/device/mixed_load_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
LOG=${OUT:-/tmp}/mixed_load; mkdir -p "$LOG"
MODEL=${MODEL:-/tmp/m.gguf}
[ -s "$MODEL" ] || "$BIN/deltaserve" gguf-synth --preset 27b --type Q6_K --out "$MODEL" >/dev/null 2>&1
PORT=${PORT:-50140}
"$BIN/deltaserve" serve --model "$MODEL" --backend cuda --slots 64 --ctx 2000000 --slot-cap 131072 --split pool \
  --kv-type q8_0 --kv-pool-tokens 2000000 --port $PORT --nvml-device off >"$LOG/serve.log" 2>&1 &
SERVE=$!
ready=0
wait_serving 127.0.0.1:$PORT $SERVE 120 && ready=1
[ $ready = 1 ] && pass "serve ready in ${i} s" || { fail "serve not ready"; tail -20 "$LOG/serve.log"; kill $SERVE; exit 1; }
grep -h "memory_plan" "$LOG/serve.log" | head -1 | cut -c1-600
t0=$SECONDS
"$BIN/deltactl" load --addr 127.0.0.1:$PORT --concurrency 4 --requests 4 --prompt-len 100000 \
  --max-tokens 32 --vocab 2000 --timeout 600 >"$LOG/long.txt" 2>&1 &
LONG=$!
"$BIN/deltactl" load --addr 127.0.0.1:$PORT --concurrency 60 --requests 60 --prompt-len 512 \
  --max-tokens 1024 --vocab 2000 --timeout 600 >"$LOG/short.txt" 2>&1 &
SHORT=$!
while kill -0 $LONG 2>/dev/null || kill -0 $SHORT 2>/dev/null; do
  echo "t=$((SECONDS - t0)) s" >>"$LOG/status.txt"
  "$BIN/deltactl" status --admin-addr 127.0.0.1:$((PORT + 1)) 2>&1 | grep -E "^queue|^context" >>"$LOG/status.txt"
  sleep 5
done
wait $LONG; rl=$?
wait $SHORT; rs=$?
echo "== 4 x 100k prompts (rc $rl), $((SECONDS - t0)) s after start"; tail -12 "$LOG/long.txt"
echo "== 60 x 512 prompts, 1024 tokens each (rc $rs)"; tail -12 "$LOG/short.txt"
[ $rl = 0 ] && pass "4 x 100k" || fail "4 x 100k"
[ $rs = 0 ] && pass "60 x 512" || fail "60 x 512"
echo "== status samples (every 5 s)"; paste - - - <"$LOG/status.txt" | head -40
kill $SERVE; wait $SERVE 2>/dev/null
exit $rc
