#!/usr/bin/env bash
# Issue #17's targets on one H200 with the 27B Q6_K synth file, one `serve` with the prefix cache
# in device memory (--prefix-cache-mb, --kv-pool-tokens leaving the card room for it):
#   1. chat: turn 1 = 16,000 random ids (+32 generated), turn 2 = turn 1 + its answer + 60 ids:
#      server TTFT of turn 2 next to a cold prompt of the same length (no shared prefix);
#   2. a 300-token prompt sent twice: the second resumes at its last token;
#   3. 64 requests at once sharing a 6,000-token prefix with 64..700 own ids: hits and tokens
#      saved from `deltactl status` (every request after the first should resume at 6,000).
# Usage (device, repo root, packed deltaserve + deltactl):
#   DS_CARRY=.devcarry-h17 bash tools/device/prefix_cache_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp}/prefix; mkdir -p "$L"
MODEL=${MODEL:-/tmp/m.gguf}
t0=$(date +%s)
[ -s "$MODEL" ] || "$BIN/deltaserve" gguf-synth --preset 27b --type Q6_K --out "$MODEL" >/dev/null 2>&1
echo "synth: $(( $(date +%s) - t0 )) s"
PORT=${PORT:-50180}
"$BIN/deltaserve" serve --model "$MODEL" --backend cuda --slots 16 --ctx 32768 --split pool \
  --kv-pool-tokens 400000 --prefix-cache-mb 40000 --port $PORT --nvml-device off >"$L/serve.log" 2>&1 &
SERVE=$!
wait_serving 127.0.0.1:$PORT $SERVE 170 && pass "serve ready in ${i}s" || { fail "serve not ready"; tail -30 "$L/serve.log"; kill $SERVE; exit 1; }
grep -h "prefix_cache\|memory_plan" "$L/serve.log" | cut -c1-400 | head -4
ids() { shuf -i "$1"-"$2" -n "$3" -r --random-source=<(yes "$4") | paste -sd,; }
gen() {  # gen IDS MAX_TOKENS TAG: prints the generated ids; TTFT etc. in $L/TAG.err
  "$BIN/deltactl" generate --addr 127.0.0.1:$PORT --prompt-ids "$1" --max-tokens "$2" --ignore-eos \
    --ids-only --timeout 120 2>"$L/$3.err"
}
st() { "$BIN/deltactl" status --admin-addr 127.0.0.1:$((PORT + 1)) 2>&1 | grep -A2 "PREFIX CACHE"; }
# 1. chat, 16k history
T1=$(ids 100 9000 16000 a)
A1=$(gen "$T1" 32 turn1)
T2="$T1,$A1,$(ids 100 9000 60 b)"
A2=$(gen "$T2" 32 turn2)
COLD=$(ids 100 9000 16092 c)
A3=$(gen "$COLD" 32 cold)
for t in turn1 turn2 cold; do echo "$t: $(tail -1 "$L/$t.err" | cut -c1-300)"; done
st
# 2. a short prompt twice
S=$(ids 100 9000 300 d)
R1=$(gen "$S" 16 short1); R2=$(gen "$S" 16 short2)
for t in short1 short2; do echo "$t: $(tail -1 "$L/$t.err" | cut -c1-300)"; done
[ "$R1" = "$R2" ] && pass "repeated short prompt: same greedy tokens" || fail "repeated short prompt: tokens differ"
st
# 3. agents: 64 requests, one 6,000-token prefix
"$BIN/deltactl" load --addr 127.0.0.1:$PORT --concurrency 64 --requests 64 --shared-prefix 6000 \
  --prompt-len 64 --prompt-len-max 700 --max-tokens 16 --vocab 9000 --seed 5 --timeout 200 >"$L/agents.txt" 2>&1
grep -E "requests:|TTFT|prompts:" "$L/agents.txt"
st
"$BIN/deltactl" status --admin-addr 127.0.0.1:$((PORT + 1)) >"$L/status.txt" 2>&1
grep -h "prefix_cache\|step_failed" "$L/serve.log" | tail -3 | cut -c1-300
kill $SERVE; wait $SERVE 2>/dev/null
echo "total: $(( $(date +%s) - t0 )) s"
exit $rc
