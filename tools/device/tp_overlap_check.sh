#!/usr/bin/env bash
# TP all-reduce overlapped with the projection GEMMs (CudaBackendOptions::overlap_allreduce,
# issue 14) on ONE GPU, with the packed binaries:
#   1. tp_custom_allreduce_test CustomTp.*: CUDA TP = 2 / 3 groups of ds_tp_rank on GPU 0, the
#      overlapped path (a 324-row prefill step cut into chunks) vs overlap off and vs TP = 1 (F32
#      1e-4 + greedy equal, Q8_0 5e-2), plus the existing TP = 2 / 3 / fused checks;
#   2. `deltaserve bench --tp 2 --gpus 0,0` on the 27B Q6_K synthetic file under MPS, alternating
#      --overlap off / on / on with 2 chunks (OVL, default "off on on:2 off on"; runs after the
#      second are skipped once the script has run BUDGET seconds, default 170), rows: PREFILL
#      (default 512,8192) and a 32-token decode (unchanged by the option: decode never overlaps).
# Usage (device, repo root, after `DS_PACK_XZ=1 DS_PACK_BUILD=build-h1-dev DS_PACK_OUT=.devcarry-h1
# tools/device/pack.sh deltaserve ds_tp_rank tp_custom_allreduce_test` here):
#   DS_CARRY=.devcarry-h1 bash tools/device/tp_overlap_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
LOG=${OUT:-/tmp}/tp_overlap; mkdir -p "$LOG"
echo "date: $(date -u +%FT%TZ)"
echo "nvidia-smi: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
( timeout 150 $BIN/deltaserve gguf-synth --preset 27b --type Q6_K --out /tmp/m.gguf >"$LOG/synth.log" 2>&1; echo "synth rc=$?" >>"$LOG/synth.log" ) &
SYNTH=$!

t0=$SECONDS
DS_TP_RANK_BIN=$BIN/ds_tp_rank timeout 150 $BIN/tp_custom_allreduce_test --gtest_filter='CustomTp.*' >"$LOG/car_test.log" 2>&1
rc_t=$?
echo "tp_custom_allreduce_test CustomTp.*: rc=$rc_t in $((SECONDS - t0)) s"
grep -E "^\[ +(OK|FAILED|SKIPPED) +\]|max \|dlogit\||Failure|Expected|Which is|overlap_allreduces" "$LOG/car_test.log" | head -60
[ $rc_t = 0 ] && pass "tp_custom_allreduce_test CustomTp.*" || fail "tp_custom_allreduce_test CustomTp.*"

wait $SYNTH; tail -1 "$LOG/synth.log"
[ -s /tmp/m.gguf ] || { fail "no 27B file"; exit $rc; }
MPS=0
if command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/ds-mps CUDA_MPS_LOG_DIRECTORY=/tmp/ds-mps-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  nvidia-cuda-mps-control -d && MPS=1
fi
echo "MPS for the bench: $MPS"
B=(--model /tmp/m.gguf --prefill "${PREFILL:-512,8192}" --decode 32 --depth 0 --conc "" --no-profile --tp 2 --gpus 0,0)
n=0
# OVL entries: off, on, or on:K (--overlap-chunks K).
for e in ${OVL:-off on on:2 off on}; do
  if [ $n -ge 2 ] && [ $SECONDS -gt ${BUDGET:-170} ]; then
    echo "time budget reached after $n bench runs ($SECONDS s)"; break
  fi
  n=$((n + 1))
  t1=$SECONDS
  v=${e%%:*}; args=(--overlap $v)
  [ "$e" != "$v" ] && args+=(--overlap-chunks ${e#*:})
  echo "== bench --tp 2 --gpus 0,0 ${args[*]} (run $n)"
  timeout 120 $BIN/deltaserve bench "${B[@]}" "${args[@]}" 2>&1 | tee "$LOG/bench_${n}_${e/:/_}.log" | grep -E "^(loaded|decode|prefill)"
  [ ${PIPESTATUS[0]} = 0 ] && pass "bench ${args[*]} (MPS $MPS, $((SECONDS - t1)) s)" || fail "bench ${args[*]} (MPS $MPS)"
done
[ $MPS = 1 ] && echo quit | nvidia-cuda-mps-control
echo "total $SECONDS s"
exit $rc
