#!/usr/bin/env bash
# Issue #17's targets on one H200 with the 27B Q6_K synth file, one `serve` with the prefix cache
# in device memory (--prefix-cache-mb; --kv-pool-tokens leaves the card room for it):
#   1. chat: turn 1 = 16,000 random ids (+32 generated), turn 2 = turn 1 + its answer + 60 ids:
#      server TTFT of turn 2 next to a cold prompt of the same length (no shared prefix);
#   2. a 300-token prompt sent twice: the second resumes at its last token;
#   3. 64 requests at once sharing a 6,000-token prefix with 64..700 own ids.
# Hits, tokens saved, bytes and evictions from the scheduler's /metrics (deltaserve_prefix_cache_*).
# Usage (device, repo root, packed deltaserve + deltactl):
#   DS_CARRY=.devcarry-h17 bash tools/device/prefix_cache_check.sh
# POOL_ARGS: the serve's pool / cache flags (default: --kv-pool-tokens 400000 --prefix-cache-mb
# 40000; e.g. "--prefix-cache-mb 40000 --prefix-cache-tier device" lets the memory planner make
# the room); AGENTS=0 skips part 3.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp}/prefix; mkdir -p "$L"
MODEL=${MODEL:-/tmp/m.gguf}
t0=$(date +%s)
[ -s "$MODEL" ] || "$BIN/deltaserve" gguf-synth --preset 27b --type Q6_K --out "$MODEL" >/dev/null 2>&1
echo "synth: $(( $(date +%s) - t0 )) s"
PORT=${PORT:-50180}; MP=${MP:-9480}
"$BIN/deltaserve" serve --model "$MODEL" --backend cuda --slots 16 --ctx 131072 --slot-cap 32768 \
  --split pool ${POOL_ARGS:---kv-pool-tokens 400000 --prefix-cache-mb 40000} --port $PORT --metrics-port $MP \
  --nvml-device off >"$L/serve.log" 2>&1 &
SERVE=$!
wait_serving 127.0.0.1:$PORT $SERVE 170 && pass "serve ready in ${i}s" || { fail "serve not ready"; tail -30 "$L/serve.log"; kill $SERVE; exit 1; }
grep -h "prefix_cache\|memory_plan" "$L/serve.log" | cut -c1-300 | head -4
ids() { shuf -i "$1"-"$2" -n "$3" -r --random-source=<(yes "$4") | paste -sd,; }
gen() {  # gen IDS MAX_TOKENS TAG: prints the generated ids; the Finished line (TTFT) in $L/TAG.err
  "$BIN/deltactl" generate --addr 127.0.0.1:$PORT --prompt-ids "$1" --max-tokens "$2" --ignore-eos \
    --ids-only --timeout 150 2>"$L/$3.err"
}
metrics() {  # the scheduler's prefix-cache series
  python3 -c "
import urllib.request
t = urllib.request.urlopen('http://127.0.0.1:$MP/metrics').read().decode()
print(' '.join(l.replace('deltaserve_prefix_cache_', '') for l in t.splitlines() if l.startswith('deltaserve_prefix_cache')))
" 2>&1 | cut -c1-600
}
fin() { for t in "$@"; do echo "$t: $(grep -o 'prompt [0-9]* tok.*' "$L/$t.err" | tail -1 | cut -c1-200)"; done; }
# 1. chat, 16k history
T1=$(ids 100 9000 16000 a)
A1=$(gen "$T1" 32 turn1)
T2="$T1,$A1,$(ids 100 9000 60 b)"
A2=$(gen "$T2" 32 turn2)
COLD=$(ids 100 9000 16092 c)
A3=$(gen "$COLD" 32 cold)
fin turn1 turn2 cold
metrics
# 2. a short prompt twice
S=$(ids 100 9000 300 d)
R1=$(gen "$S" 16 short1); R2=$(gen "$S" 16 short2)
fin short1 short2
[ -n "$R1" ] && [ "$R1" = "$R2" ] && pass "repeated short prompt: same greedy tokens" || fail "repeated short prompt: tokens differ"
metrics
# 3. agents: 64 requests at once, one 6,000-token prefix, 64..700 own ids each
if [ "${AGENTS:-1}" = 1 ]; then
P=$(ids 100 9000 6000 e)
ta=$(date +%s.%N)
for k in $(seq 1 64); do
  n=$(( 64 + (k * 37) % 637 ))
  gen "$P,$(ids 100 9000 $n s$k)" 16 agent$k >/dev/null &
done
wait_agents() { for j in $(jobs -p); do [ "$j" = "$SERVE" ] || wait "$j"; done; }
wait_agents
echo "agents: 64 requests in $(python3 -c "print(round($(date +%s.%N) - $ta, 2))") s; ok: $(grep -l 'prompt [0-9]* tok' "$L"/agent*.err | wc -l)"
python3 - "$L" <<'PY'
import glob, re, sys
v = []
for f in glob.glob(sys.argv[1] + '/agent*.err'):
    m = re.search(r'TTFT ([0-9.]+) ms', open(f).read())
    if m: v.append(float(m.group(1)))
v.sort()
if v: print(f"agents server TTFT ms: p50 {v[len(v)//2]:.1f}  p90 {v[int(len(v)*0.9)]:.1f}  max {v[-1]:.1f}  (n={len(v)})")
PY
fi
metrics
"$BIN/deltactl" status --admin-addr 127.0.0.1:$((PORT + 1)) >"$L/status.txt" 2>&1
grep -h "step_failed\|error" "$L/serve.log" | tail -3 | cut -c1-300
kill $SERVE; wait $SERVE 2>/dev/null
echo "total: $(( $(date +%s) - t0 )) s"
exit $rc
