#!/usr/bin/env bash
# The custom (CUDA IPC) all-reduce and TP on ONE GPU (issue 14), with the packed binaries:
#   1. kernels_cuda_test Ops.EmbedRows* (vocab-parallel embedding shard vs the CPU dequantization);
#   2. tp_custom_allreduce_test: 2, 3 and 4 rank processes on GPU 0 vs the CPU reference sum,
#      bitwise, eager and graph-captured; CUDA TP = 2 / 3 groups over it vs CUDA TP = 1 (F32 1e-4,
#      greedy equal; Q8_0 5e-2) with decode graphs on and the vocab-parallel embedding;
#   3. `deltaserve bench --tp 2 --gpus 0,0` on the 27B Q6_K synthetic file (both ranks on GPU 0):
#      proves the mode and gives the all-reduce latency of one 5,120-float row (eager / graph).
#      Processes on one GPU without MPS are time-sliced (a rank's spinning kernel waits for its
#      peer's time slice), so when nvidia-cuda-mps-control exists the bench runs under MPS (the
#      ranks' kernels then run concurrently, as on two GPUs); the daemon is stopped at the end.
#   4. (PARTS has worker) the worker path: scheduler + two `deltaserve worker --backend cuda
#      --tp-world 2` ranks on GPU 0 with the default collective (auto = custom) join and warm up;
#   5. (PARTS has tp1) `deltaserve bench` at TP = 1 with the same rows, for comparison.
# PARTS (default "tests bench"): any of tests bench worker tp1. FUSE (default off): the bench's
# --fuse-norm values, e.g. FUSE="off on off on" for an A/B of the fused all-reduce + RMSNorm.
# Usage (device, repo root, after `DS_PACK_XZ=1 DS_PACK_BUILD=build-h2-dev DS_PACK_OUT=.devcarry-h2
# tools/device/pack.sh deltaserve ds_tp_rank tp_custom_allreduce_test kernels_cuda_test` here):
#   DS_CARRY=.devcarry-h2 [PARTS="tests worker tp1"] bash tools/device/tp_custom_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
LOG=${OUT:-/tmp}/tp_custom; mkdir -p "$LOG"
PARTS=${PARTS:-tests bench}
has() { [[ " $PARTS " == *" $1 "* ]]; }
echo "date: $(date -u +%FT%TZ)  parts: $PARTS"
echo "nvidia-smi: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
# The 27B file is made while the tests run (CPU work).
{ has bench || has tp1; } && ( timeout 150 $BIN/deltaserve gguf-synth --preset 27b --type Q6_K --out /tmp/m.gguf >"$LOG/synth.log" 2>&1; echo "synth rc=$?" >>"$LOG/synth.log" ) &
SYNTH=$!

if has tests; then
timeout 30 $BIN/kernels_cuda_test --gtest_filter='Ops.EmbedRows*' >"$LOG/embed.log" 2>&1 \
  && pass "kernels_cuda_test Ops.EmbedRows*" || { fail "kernels_cuda_test Ops.EmbedRows*"; tail -5 "$LOG/embed.log"; }
t0=$SECONDS
DS_TP_RANK_BIN=$BIN/ds_tp_rank timeout 120 $BIN/tp_custom_allreduce_test >"$LOG/car_test.log" 2>&1
rc_t=$?
echo "tp_custom_allreduce_test: rc=$rc_t in $((SECONDS - t0)) s"
grep -E "^\[ +(OK|FAILED|SKIPPED) +\]|max \|dlogit\||rank check failed|failed checks" "$LOG/car_test.log" | head -40
[ $rc_t = 0 ] && pass "tp_custom_allreduce_test" || fail "tp_custom_allreduce_test"
fi

if has worker; then
  W=$(mktemp -d)
  $BIN/deltaserve gguf-synth --preset tiny --type F32 --seed 3 --out $W/tiny_F32.gguf 2>/dev/null || fail "make tiny_F32"
  PORT=${PORT:-50083}
  $BIN/deltaserve scheduler --listen 127.0.0.1:$PORT --slots 2 --ctx 1024 --warmup-tokens 8 >"$LOG/scheduler.log" 2>&1 &
  S=$!
  sleep 1
  WK=()
  for r in 0 1; do
    $BIN/deltaserve worker --scheduler 127.0.0.1:$PORT --model $W/tiny_F32.gguf --backend cuda \
      --tp-world 2 --tp-rank $r --tp-group g --nvml-device off --worker-id rank$r >"$LOG/worker$r.log" 2>&1 &
    WK+=($!)
  done
  ok=0
  for i in $(seq 1 60); do
    if grep -q warmup_done "$LOG/worker0.log" && grep -q warmup_done "$LOG/worker1.log"; then ok=1; break; fi
    kill -0 ${WK[0]} 2>/dev/null && kill -0 ${WK[1]} 2>/dev/null || break
    sleep 1
  done
  if [ $ok = 1 ] && grep tp_joined "$LOG/worker0.log" | grep -q 'collective=custom'; then
    pass "worker --backend cuda --tp-world 2, default collective (custom), 2 ranks on GPU 0: joined and warmed up"
  else
    fail "worker TP=2 custom (see $LOG/worker*.log)"
  fi
  grep -h tp_joined "$LOG"/worker*.log | head -2
  kill ${WK[@]} $S 2>/dev/null; wait ${WK[@]} $S 2>/dev/null
fi

has bench || has tp1 || exit $rc

wait $SYNTH; tail -2 "$LOG/synth.log"
B="--model /tmp/m.gguf --prefill 512 --decode 32 --depth 0 --conc 4 --conc-prompt 128 --conc-gen 16 --no-profile"
if has tp1; then
  timeout 100 $BIN/deltaserve bench $B 2>&1 | tee "$LOG/bench_tp1.log"
  [ ${PIPESTATUS[0]} = 0 ] && pass "bench TP=1" || fail "bench TP=1"
fi
has bench || exit $rc
MPS=0
if command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/ds-mps CUDA_MPS_LOG_DIRECTORY=/tmp/ds-mps-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  nvidia-cuda-mps-control -d && MPS=1
  # Probe: the IPC all-reduce between MPS clients (2 ranks, a few seconds).
  if [ $MPS = 1 ] && ! timeout 40 $BIN/tp_custom_allreduce_test --gtest_filter='CustomAllReduce.TwoRanks*' >"$LOG/mps_probe.log" 2>&1; then
    echo "MPS probe failed; bench without MPS"; tail -3 "$LOG/mps_probe.log"
    echo quit | nvidia-cuda-mps-control; MPS=0
  fi
fi
echo "MPS for the bench: $MPS"
if [ -s /tmp/m.gguf ]; then
  # FUSE="off on": the same bench with the all-reduce fused with the RMSNorm, for A/B.
  for f in ${FUSE:-off}; do
    echo "== bench --tp 2, --fuse-norm $f"
    timeout 130 $BIN/deltaserve bench $B --tp 2 --gpus 0,0 --fuse-norm $f 2>&1 | tee "$LOG/bench_tp2_fuse_$f.log" | grep -E "^(decode|aggregate|prefill)"
    [ ${PIPESTATUS[0]} = 0 ] && pass "bench --tp 2 --gpus 0,0 --fuse-norm $f (MPS $MPS)" || fail "bench --tp 2 --gpus 0,0 --fuse-norm $f (MPS $MPS)"
  done
else
  fail "no 27B file"
fi
[ $MPS = 1 ] && echo quit | nvidia-cuda-mps-control
exit $rc
