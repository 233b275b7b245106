#!/usr/bin/env bash
# Issue #15's demo-model row through the served path: the whole cluster on loopback (scheduler +
# one CUDA worker + gateway, the flags of cluster_run.sh) serving the committed demo model, once
# per worker --mtp setting in $MTPS (default "off $K"), alternated for $ROUNDS rounds. Per
# cluster: `deltactl generate --prompt P --max-tokens 256 $GEN_ARGS` for each prompt (after a
# 512-token warm-up request, long enough for `--mtp auto` to time its steps: draft_cost.h),
# printing the server's Finished timings (TTFT, mean inter-token, total) and the decode rate
# (generated - 1) / (total - TTFT); then `deltactl load --concurrency 1` with random prompts
# (client tok/s; LOAD=0 skips it).
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h3 DS_PACK_OUT=.devcarry-lead bash tools/device/pack.sh deltaserve deltactl):
#   DS_CARRY=.devcarry-lead [K=4 | MTPS="off 4 auto"] [ROUNDS=2] \
#     [GEN_ARGS="--temperature 0.8 --top-p 0.95 --seed 1"] [WORKER_ARGS="--deferred-drafts on"] \
#     [TAG=name] bash tools/device/demo_served_mtp.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
B=$BIN/deltaserve; C=$BIN/deltactl
MODEL=models/demo/demo-f16.gguf
LOG=${OUT:-/tmp/out}/served; mkdir -p "$LOG"
PROMPTS=("The jury said that" "In the spring of that year" "It was a cold morning, and")
serve_once() {  # $1: --mtp setting, $2: round
  local tag="${TAG:+${TAG}_}mtp_$1_r$2"
  "$B" scheduler --listen 127.0.0.1:50060 --slots 4 --max-slots 4 --ctx 16384 --split pool \
    --slot-cap 4096 --slot-ctx 4096 >"$LOG/$tag.scheduler.log" 2>&1 &
  local S=$!
  "$B" worker --scheduler 127.0.0.1:50060 --model "$MODEL" --backend "${BACKEND:-cuda}" --mtp "$1" ${WORKER_ARGS:-} \
    >"$LOG/$tag.worker.log" 2>&1 &
  local W=$!
  "$B" gateway --listen 127.0.0.1:50061 --admin-listen 127.0.0.1:50062 --scheduler 127.0.0.1:50060 \
    --model "$MODEL" >"$LOG/$tag.gateway.log" 2>&1 &
  local G=$!
  if wait_serving 127.0.0.1:50061 "$G" 60; then
    "$C" generate --addr 127.0.0.1:50061 --prompt "The warm up" --max-tokens 512 --ignore-eos \
      ${GEN_ARGS:-} >/dev/null 2>&1
    for p in "${PROMPTS[@]}"; do
      "$C" generate --addr 127.0.0.1:50061 --prompt "$p" --max-tokens 256 ${GEN_ARGS:-} \
        >"$LOG/$tag.out" 2>"$LOG/$tag.err"
      python3 - "$1" "$2" "$p" "$LOG/$tag.err" <<'PY'
import re, sys
mtp, rnd, prompt, f = sys.argv[1:]
t = open(f).read()
m = re.search(r"generated (\d+) tok \| server: queue ([0-9.]+) ms, TTFT ([0-9.]+) ms, mean inter-token ([0-9.]+) ms, total ([0-9.]+) ms", t)
if not m:
    print(f"mtp {mtp} round {rnd} | {prompt} | no timings: {t[-300:]!r}"); sys.exit()
n, q, ttft, it, tot = int(m[1]), float(m[2]), float(m[3]), float(m[4]), float(m[5])
print(f"mtp {mtp} round {rnd} | {prompt} | {n} tokens, TTFT {ttft:.2f} ms, mean inter-token {it:.4f} ms, "
      f"total {tot:.2f} ms | decode {(n - 1) / (tot - ttft) * 1e3:.1f} tok/s")
PY
    done
    [ "${LOAD:-1}" = 1 ] && "$C" load --addr 127.0.0.1:50061 --concurrency 1 --requests 4 \
      --prompt-len 64 --max-tokens 256 --vocab 4000 2>&1 | grep -iE "tok/s|accept" | head -4 |
      sed "s/^/mtp $1 round $2 load: /"
    pass "served demo mtp $1"
  else
    fail "served demo mtp $1: no SERVING"; tail -5 "$LOG/$tag.worker.log"
  fi
  kill $G $W $S 2>/dev/null; wait $G $W $S 2>/dev/null
}
for r in $(seq 1 "${ROUNDS:-2}"); do
  for m in ${MTPS:-off ${K:-4}}; do serve_once "$m" "$r"; done
done
exit $rc
