#!/usr/bin/env bash
# Issue #15's `--mtp auto` through the whole cluster on one H200: `serve` with --mtp off, 3 and
# auto, one after the other, each answering the same requests (greedy, --ignore-eos):
#   1. the synthetic 27B Q6_K file (random weights: every draft is rejected): one 300-token
#      prompt, 128 tokens; server mean inter-token per mode (auto should be near off, 3 pays
#      for drafts that are never kept);
#   2. the trained demo model: 300 ids of its vocabulary, 256 tokens (auto should keep drafting).
# Tokens must equal --mtp off in every mode; the worker's acceptance from its /metrics (P+2).
# Usage (device, repo root, packed deltaserve + deltactl):
#   DS_CARRY=.devcarry-lead bash tools/device/mtp_auto_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp}/mtp_auto; mkdir -p "$L"
MODEL=${MODEL:-/tmp/m.gguf}
[ -s "$MODEL" ] || "$BIN/deltaserve" gguf-synth --preset 27b --type Q6_K --out "$MODEL" >/dev/null 2>&1
PORT=50190; MP=9490
ids() { shuf -i 100-"$1" -n 300 -r --random-source=<(yes q) | paste -sd,; }
run() {  # run MODEL_PATH TAG MODE MAX_TOKENS (IDS: the prompt)
  "$BIN/deltaserve" serve --model "$1" --backend cuda --slots 4 --ctx 16384 --mtp "$3" \
    --port $PORT --metrics-port $MP --nvml-device off >"$L/$2_$3.serve.log" 2>&1 &
  local pid=$!
  if ! wait_serving 127.0.0.1:$PORT $pid 170; then
    fail "$2 --mtp $3: serve not ready"; tail -5 "$L/$2_$3.serve.log"; kill $pid; return
  fi
  "$BIN/deltactl" generate --addr 127.0.0.1:$PORT --prompt-ids "$IDS" --max-tokens "$4" \
    --ignore-eos --ids-only --timeout 150 >"$L/$2_$3.ids" 2>"$L/$2_$3.err"
  "$BIN/deltactl" generate --addr 127.0.0.1:$PORT --prompt-ids "$IDS" --max-tokens "$4" \
    --ignore-eos --ids-only --timeout 150 >"$L/$2_$3.ids2" 2>"$L/$2_$3.err"
  echo "$2 --mtp $3: $(grep -o 'prompt [0-9]* tok.*' "$L/$2_$3.err" | tail -1 | cut -c1-160)"
  python3 -c "
import urllib.request
t = urllib.request.urlopen('http://127.0.0.1:$((MP + 2))/metrics').read().decode()
print('   ', ' '.join(l.replace('deltaserve_worker_mtp_', '') for l in t.splitlines()
      if l.startswith('deltaserve_worker_mtp_drafts') or l.startswith('deltaserve_worker_mtp_verify_tokens_sum') or l.startswith('deltaserve_worker_mtp_verify_tokens_count'))[:1400])
" 2>&1
  kill $pid; wait $pid 2>/dev/null
  [ -s "$L/$2_$3.ids" ] || { fail "$2 --mtp $3: no tokens"; tail -3 "$L/$2_$3.err"; return; }
  if [ "$3" != off ]; then
    cmp -s "$L/$2_off.ids" "$L/$2_$3.ids" && pass "$2 --mtp $3: tokens equal --mtp off" ||
      fail "$2 --mtp $3: tokens differ from --mtp off"
  fi
}
IDS=$(ids 9000)
for mode in off 3 auto; do run "$MODEL" 27b $mode 128; done
IDS=$(ids 4000)  # the demo model's vocabulary is 4,096
for mode in off 3 auto; do run demo demo $mode 256; done
exit $rc
