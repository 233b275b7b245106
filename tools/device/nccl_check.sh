#!/usr/bin/env bash
# The NCCL tensor-parallel path at TP = 1 on one GPU (docs/tp.md §8), with the packed binaries:
#   1. tp_nccl_test: NcclCollective over a one-rank communicator (device + host buffers, inside a
#      CUDA graph) and the CUDA backend with / without the collective, bit for bit, on a tiny
#      synthesized F32 model (prefill through cuBLAS and GEMV, decode through the CUDA graphs);
#   2. `deltaserve logits --backend cuda` with and without --tp-nccl on tiny F32 and Q6_K models,
#      a 33-token and a 5-token prompt: the logits must be bit-identical;
#   3. the real worker path: scheduler + `deltaserve worker --backend cuda --tp-world 1
#      --tp-collective nccl` (NCCL id published through the scheduler's rendezvous store), which
#      must join, load and finish its warmup generation (64-token prefill + 8 graph decode steps).
# Prints one PASS/FAIL line per check; exit 1 if any failed.
# Usage (device, repo root; after `tools/device/pack.sh deltaserve tp_nccl_test` here, and with
# DS_PACK_XZ=1 unpack .devcarry/dc.tar.xz first, see pack.sh): tools/device/nccl_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
B=$BIN/deltaserve
LOG=${OUT:-/tmp}/nccl_check; mkdir -p "$LOG"
W=$(mktemp -d)

echo "nvidia-smi: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"
echo "libnccl: $(ls /usr/local/cuda/lib64/libnccl.so* 2>&1 | tr '\n' ' ')"
echo "binary resolves: $(ldd $B 2>&1 | grep -E 'nccl|not found' | tr -s ' \t' ' ' | tr '\n' ';')"

# ---- 1. gtest ----
if NCCL_DEBUG=${NCCL_DEBUG:-WARN} timeout 300 $BIN/tp_nccl_test >"$LOG/tp_nccl_test.log" 2>&1; then
  if grep -q SKIPPED "$LOG/tp_nccl_test.log"; then
    fail "tp_nccl_test skipped tests (no GPU?)"
  else
    pass "tp_nccl_test ($(grep -E '^\[  PASSED|nccl tp=1' "$LOG/tp_nccl_test.log" | tr '\n' ' '))"
  fi
else
  fail "tp_nccl_test (rc $?)"
  grep -E "FAILED|Failure|error|Expected|Which is|differ|NCCL" "$LOG/tp_nccl_test.log" | head -30
fi

# ---- 2. logits with / without --tp-nccl ----
for t in F32 Q6_K; do
  "$B" gguf-synth --preset tiny --type $t --seed 3 --out $W/tiny_$t.gguf >/dev/null 2>&1 ||
    { fail "gguf-synth $t"; continue; }
  for ids in 1,5,9,200,300,17,42,77,11,3,99,150,400,2,8,64,128,255,31,7,190,230,12,88,45,66,101,250,3,4,5,6,7 \
             3,1,4,1,5; do
    n=$(echo $ids | tr ',' '\n' | wc -l)
    if ! "$B" logits --model $W/tiny_$t.gguf --prompt-ids $ids --out $W/plain.f32 --backend cuda \
         >"$LOG/logits_plain_${t}_$n.log" 2>&1; then
      fail "logits $t n=$n without nccl: $(tail -1 "$LOG/logits_plain_${t}_$n.log")"; continue
    fi
    if ! "$B" logits --model $W/tiny_$t.gguf --prompt-ids $ids --out $W/nccl.f32 --backend cuda \
         --tp-nccl >"$LOG/logits_nccl_${t}_$n.log" 2>&1; then
      fail "logits $t n=$n --tp-nccl: $(tail -3 "$LOG/logits_nccl_${t}_$n.log" | tr '\n' ' ')"; continue
    fi
    python3 - $W/plain.f32 $W/nccl.f32 "$t" "$n" <<'PY' && pass "logits $t n=$n bit-identical with --tp-nccl" || fail "logits $t n=$n differ with --tp-nccl"
import sys, numpy as np
a = np.fromfile(sys.argv[1], '<u4'); b = np.fromfile(sys.argv[2], '<u4')
if a.size == 0 or a.size != b.size:
    print(f"  sizes {a.size} vs {b.size}"); sys.exit(1)
d = int((a != b).sum())
fa = a.view('<f4'); fb = b.view('<f4')
print(f"  {sys.argv[3]} n={sys.argv[4]}: {a.size} logits, {d} differ, max |d| {float(abs(fa - fb).max()):.3g}")
sys.exit(0 if d == 0 else 1)
PY
  done
done

# ---- 3. the worker path: scheduler + one CUDA worker with a one-rank NCCL group ----
PORT=${PORT:-50071}
"$B" scheduler --listen 127.0.0.1:$PORT --slots 2 --ctx 1024 --warmup-tokens 8 \
  >"$LOG/scheduler.log" 2>&1 &
S=$!
sleep 1
"$B" worker --scheduler 127.0.0.1:$PORT --model $W/tiny_F32.gguf --backend cuda --tp-world 1 \
  --tp-collective nccl --nvml-device off >"$LOG/worker.log" 2>&1 &
Wk=$!
ok=0
for i in $(seq 1 120); do
  grep -q warmup_done "$LOG/worker.log" && { ok=1; break; }
  kill -0 $Wk 2>/dev/null || break
  sleep 1
done
if [ $ok = 1 ] && grep -q tp_joined "$LOG/worker.log" && grep tp_joined "$LOG/worker.log" | grep -q nccl; then
  pass "worker --backend cuda --tp-world 1 --tp-collective nccl joined and warmed up: $(grep -o 'decode_tokens_per_s[^,}]*' "$LOG/worker.log" | head -1)"
else
  fail "worker with --tp-collective nccl (see $LOG/worker.log)"
  tail -15 "$LOG/worker.log"; tail -5 "$LOG/scheduler.log"
fi
kill $Wk $S 2>/dev/null; wait $Wk $S 2>/dev/null

rm -rf $W
[ $rc = 0 ] && echo "nccl_check: ALL PASS" || echo "nccl_check: SOME FAILED (logs in $LOG)"
exit $rc
