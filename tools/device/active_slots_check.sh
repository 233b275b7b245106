#!/usr/bin/env bash
# Issue #23's recurrent state per active sequence on one H200: `serve` of the 27B Q6_K synth file
# with --slots 17 --max-active 17 (the worker is configured for 64 slots, state for 17 + the warmup
# scratch) — the memory plan's recurrent GiB next to the 9.6 GiB of 64 + 1 slots — then 16
# streams of 512-token prompts that must all complete; then the decode bench of the final code.
# Usage (device, repo root, packed deltaserve + deltactl):
#   DS_CARRY=.devcarry-lead bash tools/device/active_slots_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp}/active_slots; mkdir -p "$L"
MODEL=${MODEL:-/tmp/m.gguf}
[ -s "$MODEL" ] || "$BIN/deltaserve" gguf-synth --preset 27b --type Q6_K --out "$MODEL" >/dev/null 2>&1
PORT=${PORT:-50170}
"$BIN/deltaserve" serve --model "$MODEL" --backend cuda --slots 17 --max-active 17 --ctx 65536 \
  --split pool --port $PORT --nvml-device off >"$L/serve.log" 2>&1 &
SERVE=$!
ready=0
wait_serving 127.0.0.1:$PORT $SERVE 150 && ready=1
[ $ready = 1 ] && pass "serve ready" || { fail "serve not ready"; tail -20 "$L/serve.log"; kill $SERVE; exit 1; }
grep -h "memory_plan\|slots_reduced" "$L/serve.log" | head -3 | cut -c1-700
"$BIN/deltactl" status --admin-addr 127.0.0.1:$((PORT + 1)) 2>&1 | grep -E "^slots|^queue|^context" | head -4
"$BIN/deltactl" load --addr 127.0.0.1:$PORT --concurrency 16 --requests 32 --prompt-len 512 \
  --max-tokens 128 --vocab 2000 --timeout 120 >"$L/load.txt" 2>&1; r=$?
tail -9 "$L/load.txt"
[ $r = 0 ] && pass "32 requests at 16 streams with state for 17" || fail "load rc=$r"
kill $SERVE; wait $SERVE 2>/dev/null
timeout 150 "$BIN/deltaserve" bench --model "$MODEL" --prefill 512 --decode 64 --depth 0 --conc 1,16,64 \
  --conc-gen 32 --no-profile >"$L/bench.log" 2>&1; r=$?
grep -vE "^\s*$" "$L/bench.log" | tail -16
[ $r = 0 ] && pass "bench" || fail "bench rc=$r"
exit $rc
