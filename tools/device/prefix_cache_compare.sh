#!/usr/bin/env bash
# Issue #17 on one H200, the 27B Q6_K synth file: the same chat (turn 1 = 16,000 random ids + 32
# generated, turn 2 = turn 1 + its answer + 60 ids) and a 300-token prompt sent twice, through
# `serve` with the prefix cache (device tier) and with --prefix-cache off: server TTFT of each
# and whether the greedy tokens are the same.
# Usage (device, repo root, packed deltaserve + deltactl):
#   DS_CARRY=.devcarry-h17 bash tools/device/prefix_cache_compare.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp}/cmp; mkdir -p "$L"
MODEL=${MODEL:-/tmp/m.gguf}
[ -s "$MODEL" ] || "$BIN/deltaserve" gguf-synth --preset 27b --type Q6_K --out "$MODEL" >/dev/null 2>&1
ids() { shuf -i "$1"-"$2" -n "$3" -r --random-source=<(yes "$4") | paste -sd,; }
T1=$(ids 100 9000 16000 a); U2=$(ids 100 9000 60 b); S=$(ids 100 9000 300 d)
for mode in on off; do
  PORT=$([ $mode = on ] && echo 50190 || echo 50195)
  "$BIN/deltaserve" serve --model "$MODEL" --backend cuda --slots 16 --ctx 131072 --slot-cap 32768 \
    --split pool --kv-pool-tokens 400000 --prefix-cache $mode --prefix-cache-mb 40000 --port $PORT \
    --nvml-device off >"$L/serve_$mode.log" 2>&1 &
  SERVE=$!
  wait_serving 127.0.0.1:$PORT $SERVE 170 && pass "serve ($mode) ready in ${i}s" || { fail "serve $mode"; tail -20 "$L/serve_$mode.log"; kill $SERVE; exit 1; }
  gen() { "$BIN/deltactl" generate --addr 127.0.0.1:$PORT --prompt-ids "$1" --max-tokens "$2" \
            --ignore-eos --ids-only --timeout 150 2>"$L/$3_$mode.err"; }
  A1=$(gen "$T1" 32 turn1); echo "$A1" >"$L/a1_$mode"
  A2=$(gen "$T1,$A1,$U2" 32 turn2); echo "$A2" >"$L/a2_$mode"
  R1=$(gen "$S" 16 short1); R2=$(gen "$S" 16 short2); echo "$R1 $R2" >"$L/r_$mode"
  for t in turn1 turn2 short1 short2; do
    echo "$mode $t: $(grep -o 'prompt [0-9]* tok.*' "$L/${t}_$mode.err" | tail -1 | cut -c1-160)"
  done
  kill $SERVE; wait $SERVE 2>/dev/null
done
for f in a1 a2 r; do
  cmp -s "$L/${f}_on" "$L/${f}_off" && pass "$f: same greedy tokens with and without the cache" \
    || { fail "$f: tokens differ with the cache"; paste -d'\n' "$L/${f}_on" "$L/${f}_off" | cut -c1-200; }
done
exit $rc
