#!/usr/bin/env bash
# Tensor parallelism on the CUDA backend, on ONE GPU (docs/tp.md "CUDA shards"), with the packed
# binaries. NCCL refuses two ranks on one device, so the ranks talk through the host-staged Gloo
# collective (HostStagedCollective; every all-reduce synchronises the stream, no CUDA graphs):
#   1. `ds_tp_rank --backend cuda`: TP = 1 (reference) and groups of 2-4 rank processes on GPU 0,
#      even and uneven splits, vocab-parallel and rank-0 lm_head, aligned and unaligned (f32
#      column slices) head granules, ranks that own no heads of a kind; on the TP test shape
#      (ds_tp_rank --make-model) and the gguf-synth tiny preset, F32 and Q8_0. Compared: every
#      logit of the prefill (all rows of a 24-token prompt) and of 8 greedy decode steps of two
#      sequences (max |Δ| / max |logit|) and the greedy tokens; each rank's memory plan is printed;
#   2. informational: CUDA TP = 1 vs CPU TP = 1 on the same models (the GPU-vs-CPU bound of
#      check_gpu_vs_cpu.sh, 2e-3 for F32);
#   3. the worker path: scheduler + two `deltaserve worker --backend cuda --tp-world 2
#      --tp-collective gloo` ranks on GPU 0 must join (staged-gloo), load their shards and finish
#      the warmup generation in lock-step;
#   4. tp_nccl_test (if packed): the TP = 1 NCCL path is unchanged (bit-identical with/without).
# Bounds (CUDA TP = W vs CUDA TP = 1, relative to max |logit|): F32 1e-4 — the f32 sums are only
# reordered (split K of the row-parallel projections, the all-reduce), but the K/V cache is f16,
# so a reordered sum can flip one 16-bit rounding; quantized 1e-2 (prefill rows go through bf16
# GEMM operands there). Greedy tokens must be identical.
# Usage (device, repo root, after `DS_PACK_XZ=1 tools/device/pack.sh deltaserve ds_tp_rank
# tp_nccl_test` here): tools/device/tp_cuda_check.sh. One PASS/FAIL line per check; exit 1 on any FAIL.
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ -z "${BIN:-}" ] && [ -f .devcarry/dc.tar.xz ] && [ ! -d .devcarry/bin ]; then
  x=$(mktemp -d) && tar -C "$x" -xJf .devcarry/dc.tar.xz && rm -rf .devcarry && mv "$x/dc" .devcarry
fi
export LD_LIBRARY_PATH="$PWD/.devcarry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0
BIN=${BIN:-.devcarry/bin}
R=$BIN/ds_tp_rank
B=$BIN/deltaserve
LOG=${OUT:-/tmp}/tp_cuda_check; mkdir -p "$LOG"
W=$(mktemp -d)
rc=0
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; rc=1; }

echo "date: $(date -u +%FT%TZ)"
echo "nvidia-smi: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"

# ---- models ----
$R --make-model $W/tp_F32.gguf --shape tp --type F32 || fail "make tp_F32"
$R --make-model $W/tp_Q8_0.gguf --shape tp --type Q8_0 || fail "make tp_Q8_0"
$B gguf-synth --preset tiny --type F32 --seed 3 --out $W/tiny_F32.gguf 2>/dev/null || fail "make tiny_F32"
$B gguf-synth --preset tiny --type Q8_0 --seed 3 --out $W/tiny_Q8_0.gguf 2>/dev/null || fail "make tiny_Q8_0"

# run_group BACKEND MODEL WORLD NAME [extra ds_tp_rank flags...]: WORLD rank processes at once.
run_group() {
  local be=$1 model=$2 world=$3 name=$4; shift 4
  local pids=() r ok=0
  rm -rf $W/st_$name
  for r in $(seq 0 $((world - 1))); do
    $R --backend $be --model $W/$model.gguf --rank $r --world $world --store $W/st_$name \
      --prefix $name --out $W/$name.json --gen 8 --threads 4 "$@" >"$LOG/$name.$r.log" 2>&1 &
    pids+=($!)
  done
  for r in "${!pids[@]}"; do
    wait ${pids[$r]} || { ok=1; echo "  $name rank $r failed: $(tail -2 "$LOG/$name.$r.log" | tr '\n' ' ')"; }
  done
  return $ok
}

# compare REF GOT WORLD BOUND LABEL
compare() {
  python3 - "$W/$1.json" "$W/$2.json" "$3" "$4" "$5" <<'PY'
import json, sys
ref, got, world, bound, label = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
a = json.load(open(got)); b = json.load(open(ref))
ok = True
md = ma = 0.0
if len(a['logits']) != len(b['logits']):
    print(f"  {label}: {len(a['logits'])} logit steps vs {len(b['logits'])}"); sys.exit(1)
for sa, sb in zip(a['logits'], b['logits']):
    if len(sa) != len(sb):
        print(f"  {label}: step sizes {len(sa)} vs {len(sb)}"); sys.exit(1)
    for x, y in zip(sa, sb):
        md = max(md, abs(x - y)); ma = max(ma, abs(y))
rel = md / ma if ma > 0 else float('inf')
same_tok = a['tokens'] == b['tokens']
for r in range(1, world):
    o = json.load(open(got + '.' + str(r)))
    same_tok &= o['tokens'] == a['tokens']
ok = ma > 0.1 and rel < bound and same_tok
dec = a.get('decode_forward_ms', 0.0)
print(f"  {label}: max|dlogit| {md:.3g} / max|logit| {ma:.3g} = rel {rel:.2e} (bound {bound:g}), "
      f"greedy tokens {'identical' if same_tok else 'DIFFER'} ({sum(len(t) for t in a['tokens'])}), "
      f"decode {dec:.2f} ms/step")
if 'ranks' in a:
    for r, x in enumerate(a['ranks']):
        print(f"    rank {r}: attn {x['attn']} gdn {x['gdn']} ffn {x['ffn']} vocab {x['vocab']} "
              f"planned weights {x['weight_bytes']} B")
for r in range(world):
    o = a if r == 0 else json.load(open(got + '.' + str(r)))
    if 'cuda_memory' in o:
        print(f"    rank {r} CUDA memory plan: {o['cuda_memory']['text']} "
              f"(weights {o['cuda_memory']['weights']} B)")
sys.exit(0 if ok else 1)
PY
}

# ---- 1. CUDA TP = W vs CUDA TP = 1 ----
check() {  # check MODEL WORLD NAME BOUND [flags...]
  local model=$1 world=$2 name=$3 bound=$4; shift 4
  if run_group cuda $model $world $name "$@"; then
    local out s l
    out=$(compare ref_$model $name $world $bound "$model tp$world${*:+ $*}")
    s=$?
    l=$(echo "$out" | head -1 | sed 's/^  //')
    if [ $s = 0 ]; then pass "$l"; else fail "$l"; fi
    echo "$out" | tail -n +2
  else
    fail "$model tp$world${*:+ $*} (a rank failed; logs $LOG/$name.*.log)"
  fi
}
for m in tp_F32 tp_Q8_0 tiny_F32 tiny_Q8_0; do
  run_group cuda $m 1 ref_$m || fail "$m cuda tp1 reference"
  run_group cpu $m 1 cpu_$m || fail "$m cpu tp1 reference"
  grep -h "CUDA memory plan" "$LOG/ref_$m.0.log" | sed "s/^/  $m tp1: /"
done
F=1e-4; Q=1e-2
check tp_F32 2 f32_w2 $F
check tp_F32 2 f32_w2_12 $F --split 1,2
check tp_F32 2 f32_w2_rank0 $F --lm-head rank0
check tp_F32 3 f32_w3 $F
check tp_F32 4 f32_w4_1113 $F --split 1,1,1,3
check tp_Q8_0 2 q8_w2 $Q
check tp_Q8_0 2 q8_w2_12 $Q --split 1,2
check tp_Q8_0 2 q8_w2_noalign $Q --no-align
check tp_Q8_0 4 q8_w4_1113 $Q --split 1,1,1,3
check tiny_F32 2 tiny_f32_w2 $F
check tiny_F32 2 tiny_f32_w2_12 $F --split 1,2
check tiny_Q8_0 2 tiny_q8_w2 $Q

# ---- 2. CUDA vs CPU at TP = 1 (informational, check_gpu_vs_cpu.sh's F32 bound) ----
for m in tp_F32 tp_Q8_0 tiny_F32 tiny_Q8_0; do
  [ -f $W/ref_$m.json ] && [ -f $W/cpu_$m.json ] || continue
  b=2e-3; [ ${m#*_} = F32 ] || b=1
  compare cpu_$m ref_$m 1 $b "info: $m cuda tp1 vs cpu tp1" | head -1
done

# ---- 3. the worker path: scheduler + 2 CUDA ranks on GPU 0 over staged Gloo ----
PORT=${PORT:-50081}
$B scheduler --listen 127.0.0.1:$PORT --slots 2 --ctx 1024 --warmup-tokens 8 >"$LOG/scheduler.log" 2>&1 &
S=$!
sleep 1
WK=()
for r in 0 1; do
  $B worker --scheduler 127.0.0.1:$PORT --model $W/tiny_F32.gguf --backend cuda --tp-world 2 \
    --tp-rank $r --tp-group g --split 1,2 --tp-collective gloo --nvml-device off \
    --worker-id rank$r >"$LOG/worker$r.log" 2>&1 &
  WK+=($!)
done
ok=0
for i in $(seq 1 90); do
  if grep -q warmup_done "$LOG/worker0.log" && grep -q warmup_done "$LOG/worker1.log"; then ok=1; break; fi
  kill -0 ${WK[0]} 2>/dev/null && kill -0 ${WK[1]} 2>/dev/null || break
  sleep 1
done
if [ $ok = 1 ] && grep tp_joined "$LOG/worker0.log" | grep -q staged-gloo; then
  pass "worker --backend cuda --tp-world 2 --tp-collective gloo (2 ranks, GPU 0) joined and warmed up: $(grep -o 'decode_tokens_per_s[^,}]*' "$LOG/worker0.log" | head -1)"
else
  fail "worker TP=2 staged gloo (see $LOG/worker*.log)"
  tail -5 "$LOG/worker0.log"; tail -5 "$LOG/worker1.log"; tail -5 "$LOG/scheduler.log"
fi
kill ${WK[@]} $S 2>/dev/null; wait ${WK[@]} $S 2>/dev/null

# ---- 5. timing (informational): a larger model, TP = 1 (CUDA graphs) vs TP = 2 staged ----
# Two processes share one GPU and every all-reduce round-trips through the host: this measures the
# cost of the testing path, not what NCCL on two GPUs would give.
if $R --make-model $W/perf.gguf --shape perf; then
  for w in 1 2; do
    if run_group cuda perf $w perf$w --prompt 64 --prompt2 16 --gen 32 --no-logits; then
      python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(f'  perf shape TP={sys.argv[2]} cuda: prefill (80 tok) {d[\"prefill_forward_ms\"]:.2f} ms, decode {d[\"decode_forward_ms\"]:.3f} ms/step (2 seqs)')" $W/perf$w.json $w
      grep -h "CUDA memory plan" "$LOG"/perf$w.*.log | sed 's/^/    /'
    else
      echo "  perf TP=$w failed (see $LOG/perf$w.*.log)"
    fi
  done
fi

# ---- 4. TP = 1 NCCL regression ----
if [ -x $BIN/tp_nccl_test ]; then
  if timeout 120 $BIN/tp_nccl_test >"$LOG/tp_nccl_test.log" 2>&1 && ! grep -q SKIPPED "$LOG/tp_nccl_test.log"; then
    pass "tp_nccl_test ($(grep -E '^\[  PASSED' "$LOG/tp_nccl_test.log"))"
  else
    fail "tp_nccl_test"; grep -E "FAILED|Failure|Expected|Which is" "$LOG/tp_nccl_test.log" | head -20
  fi
fi

rm -rf $W
[ $rc = 0 ] && echo "tp_cuda_check: ALL PASS" || echo "tp_cuda_check: SOME FAILED (logs in $LOG)"
exit $rc
