#!/usr/bin/env bash
# Issue #17 under tensor parallelism on the CUDA backend, on ONE H200: `serve --tp 2 --gpus 0,0`
# (both ranks on GPU 0, the custom IPC all-reduce) with the prefix cache in device memory. Chat: turn 1 = 2,000 random ids (+16 generated), turn 2 = turn 1 + its
# answer + 60 ids, then a cold prompt of turn 2's length; the scheduler's prefix-cache series
# (hits, tokens saved, failures) and each rank's `prefix_cache` log line. Two ranks sharing one
# GPU are time-sliced between their contexts (every all-reduce waits for the other process's
# turn): a check of the mechanism, not a speed figure (one GPU per rank in production).
# Usage (device, repo root, packed deltaserve + deltactl):
#   DS_CARRY=.devcarry-lead bash tools/device/prefix_cache_tp_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp}/prefix_tp; mkdir -p "$L"
MODEL=${MODEL:-/tmp/m.gguf}
[ -s "$MODEL" ] || "$BIN/deltaserve" gguf-synth --preset 27b --type Q6_K --out "$MODEL" >/dev/null 2>&1
PORT=50200; MP=9500
"$BIN/deltaserve" serve --model "$MODEL" --backend cuda --tp 2 --gpus 0,0 --slots 4 \
  --ctx 32768 --prefix-cache-mb 8000 --prefix-cache-tier device --memory-fraction 0.45 \
  --port $PORT --metrics-port $MP --nvml-device off >"$L/serve.log" 2>&1 &
SERVE=$!
wait_serving 127.0.0.1:$PORT $SERVE 240 && pass "serve --tp 2 ready in ${i}s" ||
  { fail "serve --tp 2 not ready"; tail -30 "$L/serve.log"; kill $SERVE; exit 1; }
grep -h "event=prefix_cache" "$L/serve.log" | cut -c1-220
ids() { shuf -i 100-9000 -n "$1" -r --random-source=<(yes "$2") | paste -sd,; }
gen() {
  "$BIN/deltactl" generate --addr 127.0.0.1:$PORT --prompt-ids "$1" --max-tokens "$2" \
    --ignore-eos --ids-only --timeout 200 2>"$L/$3.err"
}
T1=$(ids 2000 a)
A1=$(gen "$T1" 16 turn1)
T2="$T1,$A1,$(ids 60 b)"
A2=$(gen "$T2" 16 turn2)
A3=$(gen "$(ids 2076 c)" 16 cold)
for t in turn1 turn2 cold; do echo "$t: $(grep -o 'prompt [0-9]* tok.*' "$L/$t.err" | tail -1 | cut -c1-160)"; done
M=$(python3 -c "
import urllib.request
t = urllib.request.urlopen('http://127.0.0.1:$MP/metrics').read().decode()
print(' '.join(l.replace('deltaserve_prefix_cache_', '') for l in t.splitlines() if l.startswith('deltaserve_prefix_cache')))
" 2>&1 | cut -c1-500)
echo "$M"
echo "$M" | grep -q "hits_total 1 " && pass "turn 2 hit on the TP group" || fail "no hit"
echo "$M" | grep -q "failures_total 0 " && pass "no failed saves" || fail "failed saves"
[ -n "$A2" ] && [ -n "$A3" ] && pass "all turns answered" || fail "a turn got no tokens"
kill $SERVE; wait $SERVE 2>/dev/null
exit $rc
