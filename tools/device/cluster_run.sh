#!/usr/bin/env bash
# The whole cluster on the GPU machine: scheduler + one CUDA worker + gateway on loopback, serving
# the 27B-shape random Q6_K model, driven by `deltactl load`. Prints the client-side figures and,
# from the scheduler's /metrics, the per-step control overhead (step time minus the worker's
# forward+sample time) at batch 1 and under concurrency.
# Usage (device, repo root, after tools/device/pack.sh deltaserve deltactl): tools/device/cluster_run.sh
# Env: SCHED_ARGS (extra scheduler flags, e.g. --spin-wait off), WORKER_ARGS (extra worker flags,
# e.g. --mtp 3), CONCS (default "1 16"), VOCAB (ids of the random prompts, default 248320),
# DS_CARRY (the carry folder, default .devcarry).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
B=$BIN/deltaserve; C=$BIN/deltactl
MODEL=${MODEL:-/tmp/q6k-27b.gguf}
LOG=${OUT:-/tmp}/cluster_run; mkdir -p "$LOG"
[ -f "$MODEL" ] || "$B" gguf-synth --preset 27b --type Q6_K --out "$MODEL" 2>&1 | tail -1
"$B" scheduler --listen 127.0.0.1:50060 --slots 16 --max-slots 16 --ctx 131072 --split pool \
  --slot-cap 8192 --slot-ctx 8192 --metrics-listen 127.0.0.1:9460 --log-interval 1 ${SCHED_ARGS:-} \
  >"$LOG/scheduler.log" 2>&1 &
S=$!
"$B" worker --scheduler 127.0.0.1:50060 --model "$MODEL" --backend cuda ${WORKER_ARGS:-} \
  >"$LOG/worker.log" 2>&1 &
W=$!
"$B" gateway --listen 127.0.0.1:50061 --admin-listen 127.0.0.1:50062 --scheduler 127.0.0.1:50060 \
  --model "$MODEL" --max-inflight 64 >"$LOG/gateway.log" 2>&1 &
G=$!
trap 'kill $G $W $S 2>/dev/null; wait 2>/dev/null' EXIT
for i in $(seq 1 180); do
  [ "$("$C" health --addr 127.0.0.1:50061 2>/dev/null)" = SERVING ] && break; sleep 1
done
echo "health: $("$C" health --addr 127.0.0.1:50061 2>&1)"
scrape() { python3 -c "
import urllib.request, re
t = urllib.request.urlopen('http://127.0.0.1:9460/metrics').read().decode()
def v(n):
    m = re.search(r'^' + n + r'(?:\{[^}]*\})? ([0-9.e+-]+)$', t, re.M); return float(m.group(1)) if m else 0.0
print(v('deltaserve_step_duration_seconds_sum'), v('deltaserve_step_worker_seconds_sum'), v('deltaserve_step_duration_seconds_count'))"; }
for conc in ${CONCS:-1 16}; do
  before=$(scrape); cpu0=$(awk '{print $14 + $15}' /proc/$S/stat); t0=$(date +%s.%N)
  "$C" load --addr 127.0.0.1:50061 --concurrency $conc --requests $((conc * 2)) --prompt-len 512 \
    --max-tokens 128 --vocab ${VOCAB:-248320} 2>&1 | tee "$LOG/load_c$conc.txt" | tail -25
  after=$(scrape); cpu1=$(awk '{print $14 + $15}' /proc/$S/stat); t1=$(date +%s.%N)
  echo "  scheduler process CPU: $(python3 -c "print(f'{($cpu1 - $cpu0) / $(getconf CLK_TCK) / ($t1 - $t0) * 100:.0f}% of one core')")"
  python3 -c "
b = [float(x) for x in '$before'.split()]; a = [float(x) for x in '$after'.split()]
steps = a[2] - b[2]; tot = a[0] - b[0]; wrk = a[1] - b[1]
print(f'concurrency $conc: {steps:.0f} steps, mean step {tot/steps*1e3:.2f} ms, worker {wrk/steps*1e3:.2f} ms, '
      f'control overhead {(tot-wrk)/steps*1e6:.0f} us/step = {(tot-wrk)/tot*100:.2f}% of the step')"
  # The scheduler's own breakdown (cumulative since start; logged every second while stepping):
  # worker bookkeeping outside forward+sample, schedule+send, apply+route, transport.
  sleep 1.5
  grep step_overhead "$LOG/scheduler.log" | tail -1 | sed 's/^/  scheduler: /'
done
"$C" status --admin-addr 127.0.0.1:50062 2>&1 | head -12
