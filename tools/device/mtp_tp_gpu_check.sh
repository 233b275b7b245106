#!/usr/bin/env bash
# MTP under tensor parallelism on CUDA (issue #15, docs/tp.md §10) on ONE GPU, with the packed
# binaries:
#   1. worker_mtp_tp_gpu_test: two in-process ranks on GPU 0 (host-staged Gloo), demo model:
#      greedy with MTP = the group's tokens without MTP, drafts accepted; sampled agree + repeat;
#   2. mtp_gpu_test (the MTP pass at TP = 1 after the TP changes), gdn_cuda_test,
#      kernels_cuda_test, gpu_vs_cpu_test;
#   3. the worker path: scheduler + two `deltaserve worker --backend cuda --tp-world 2` ranks on
#      GPU 0 (default collective: custom, graphs) + gateway, the demo model, --mtp off then 3:
#      the same 300-id prompt, 256 greedy tokens; tokens must be equal, and the MTP run must
#      take fewer steps (the workers' verify metrics).
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h3 DS_PACK_OUT=.devcarry-lead bash tools/device/pack.sh \
#     deltaserve deltactl worker_mtp_tp_gpu_test mtp_gpu_test gdn_cuda_test kernels_cuda_test \
#     gpu_vs_cpu_test):
#   DS_CARRY=.devcarry-lead [PARTS="tests worker"] bash tools/device/mtp_tp_gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=/tmp/mtp_tp; mkdir -p "$L"  # logs stay on the device; the script prints what matters
PARTS=${PARTS:-tests worker}
has() { [[ " $PARTS " == *" $1 "* ]]; }
echo "date: $(date -u +%FT%TZ)  parts: $PARTS"

if has tests; then
  # Each test binary that was packed (the carry limit may split them over calls).
  for t in worker_mtp_tp_gpu_test mtp_gpu_test gdn_cuda_test kernels_cuda_test gpu_vs_cpu_test; do
    [ -x "$BIN/$t" ] || { echo "skip $t (not packed)"; continue; }
    t0=$SECONDS
    timeout 300 "$BIN/$t" >"$L/$t.log" 2>&1 && pass "$t ($((SECONDS - t0)) s)" ||
      { fail "$t"; grep -E "FAILED|Failure|Expected|Which is" "$L/$t.log" | head -12; }
  done
  [ -f "$L/worker_mtp_tp_gpu_test.log" ] && grep -E "^CUDA TP|^\[ +(OK|FAILED) +\]" "$L/worker_mtp_tp_gpu_test.log"
fi

if has worker; then
  IDS=$(shuf -i 100-4000 -n 300 -r --random-source=<(yes q) | paste -sd,)
  cluster() {  # cluster MODE: scheduler + 2 CUDA ranks + gateway, one greedy request, then down
    local mode=$1 port=50210 gp=50211
    "$BIN/deltaserve" scheduler --listen 127.0.0.1:$port --slots 2 --ctx 2048 >"$L/sched_$mode.log" 2>&1 &
    local S=$! WK=()
    sleep 1
    for r in 0 1; do
      "$BIN/deltaserve" worker --scheduler 127.0.0.1:$port --model models/demo/demo-f16.gguf \
        --backend cuda --tp-world 2 --tp-rank $r --tp-group g --mtp "$mode" --nvml-device off \
        --worker-id rank$r >"$L/worker${r}_$mode.log" 2>&1 &
      WK+=($!)
    done
    "$BIN/deltaserve" gateway --listen 127.0.0.1:$gp --admin-listen 127.0.0.1:50212 \
      --scheduler 127.0.0.1:$port --model models/demo/demo-f16.gguf >"$L/gw_$mode.log" 2>&1 &
    local G=$!
    if wait_serving 127.0.0.1:$gp $G 150; then
      "$BIN/deltactl" generate --addr 127.0.0.1:$gp --prompt-ids "$IDS" --max-tokens 256 \
        --ignore-eos --ids-only --timeout 120 >"$L/ids_$mode" 2>"$L/gen_$mode.err"
      echo "--mtp $mode: $(grep -o 'prompt [0-9]* tok.*' "$L/gen_$mode.err" | tail -1 | cut -c1-160)"
      grep -h tp_joined "$L"/worker*_$mode.log | head -2
      grep -ho 'mtp[a-z_]*=[^ ]*' "$L/worker0_$mode.log" | sort -u | head -5
    else
      fail "--mtp $mode: cluster not serving"; tail -n 4 "$L"/worker*_$mode.log "$L/gw_$mode.log"
    fi
    kill $G ${WK[@]} $S 2>/dev/null; wait $G ${WK[@]} $S 2>/dev/null
  }
  cluster off
  cluster 3
  if [ -s "$L/ids_off" ] && cmp -s "$L/ids_off" "$L/ids_3"; then
    pass "worker TP=2 (custom collective) --mtp 3: 256 tokens equal --mtp off"
  else
    fail "worker TP=2 --mtp 3 vs off: tokens differ or missing ($(wc -c <"$L/ids_off" 2>/dev/null) / $(wc -c <"$L/ids_3" 2>/dev/null) bytes)"
  fi
fi
exit $rc
