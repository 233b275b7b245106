#!/usr/bin/env bash
# Issue #23 on the GPU machine: the paged KV pool's gpu test, the README's serve commands on the
# 27B Q6_K (--slots 4 --ctx 32768 --split pool; --ctx 131072 --kv-type q4_0) with the memory plan
# each worker logs, and the decode bench to set next to docs/perf/h200.md.
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h3 DS_PACK_OUT=.devcarry-h3 tools/device/pack.sh deltaserve paged_kv_gpu_test):
#   DS_CARRY=.devcarry-h3 bash tools/device/paged_kv_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
B=$BIN/deltaserve
M=${MODEL:-/tmp/m.gguf}
L=${OUT:-/tmp}/paged_kv; mkdir -p "$L"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
stamp "paged_kv_gpu_test"
timeout 60 "$BIN/paged_kv_gpu_test" >"$L/paged_kv_gpu_test.log" 2>&1
r=$?; grep -E "^\[  |paged f16|Failure|Expected|Which is" "$L/paged_kv_gpu_test.log" | head -40
[ $r = 0 ] && pass "paged_kv_gpu_test" || fail "paged_kv_gpu_test rc=$r"
stamp "synth"
[ -f "$M" ] || "$B" gguf-synth --preset 27b --type Q6_K --out "$M" 2>&1 | tail -1
serve_case() {  # name, serve flags...
  local name=$1; shift
  stamp "serve $*"
  timeout 80 "$B" serve --model "$M" --backend cuda "$@" --demo "The paged pool" \
    --demo-max-tokens 24 >"$L/$name.log" 2>&1
  local r=$?
  grep -E "memory_plan|kv_pool|worker_ready|error|Error|refus" "$L/$name.log" | cut -c1-600 | head -8
  [ $r = 0 ] && pass "serve $*" || { tail -5 "$L/$name.log"; fail "serve $* rc=$r"; }
}
serve_case s4_ctx32k --slots 4 --ctx 32768 --split pool
serve_case ctx128k_q4 --ctx 131072 --kv-type q4_0
stamp "bench"
timeout 100 "$B" bench --model "$M" --prefill 512 --decode 64 --depth 0 --conc 1,16,64 --conc-gen 32 \
  --no-profile >"$L/bench.log" 2>&1
r=$?; grep -vE "^\s*$" "$L/bench.log" | tail -25
[ $r = 0 ] && pass "bench" || fail "bench rc=$r"
stamp "done"
exit $rc
