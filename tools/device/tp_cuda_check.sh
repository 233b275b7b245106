#!/usr/bin/env bash
# Tensor parallelism on the CUDA backend, on ONE GPU (docs/tp.md §9), with the packed binaries.
# NCCL refuses two ranks on one device, so the ranks talk through the host-staged Gloo collective
# (HostStagedCollective; every all-reduce synchronises the stream, no CUDA graphs).
# Every run does one prefill step (slot 0: 24 tokens, all logits; slot 1: 9 tokens) and 8 decode
# steps of both slots (ds_tp_rank). CPU TP = 1 picks the greedy tokens; every other run is FED
# those tokens (--follow), so logits are comparable at every step even where an argmax differs.
#   0./1. CUDA TP = 1, with and without decode graphs, vs CPU TP = 1 (F32 bound 2e-3 as in
#      check_gpu_vs_cpu.sh), and `deltaserve logits` (one sequence) cuda vs cpu;
#   2. groups of 2-4 `ds_tp_rank --backend cuda` processes on GPU 0 vs CUDA TP = 1: even / uneven
#      splits, vocab-parallel and rank-0 lm_head, aligned and unaligned (f32 column slices) head
#      granules, ranks that own no heads of a kind; TP test shape and gguf-synth tiny preset, F32
#      and Q8_0. Bounds (max |Δlogit| / max |logit|, any step): F32 1e-4 (the f32 sums are only
#      reordered: split K of the row-parallel projections, the all-reduce; the K/V cache is f16, so
#      a reordered sum can flip one 16-bit rounding), quantized 5e-2 (bf16 GEMM operands for the
#      prefill rows; in decode, the int8 re-quantization of activations whose f32 sums were
#      reordered flips single roundings of amax/127: measured 2.4e-2 and 3.5e-2 on the H200 with
#      all greedy tokens equal, 2026-11-29). Each rank's plan and CUDA memory plan are printed;
#   4. tp_nccl_test (TP = 1 NCCL path bit-identical with / without the collective);
#   3. the worker path: scheduler + two `deltaserve worker --backend cuda --tp-world 2
#      --tp-collective gloo` ranks on GPU 0 must join (staged-gloo), load their shards and finish
#      the warmup generation in lock-step;
#   5. timing (informational) on the perf shape: TP = 1 (graphs) vs TP = 2 staged.
# Usage (device, repo root, after `DS_PACK_XZ=1 tools/device/pack.sh deltaserve ds_tp_rank
# tp_nccl_test` here): tools/device/tp_cuda_check.sh. One PASS/FAIL line per check; exit 1 on any FAIL.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
R=$BIN/ds_tp_rank
B=$BIN/deltaserve
LOG=${OUT:-/tmp}/tp_cuda_check; mkdir -p "$LOG"
W=$(mktemp -d)

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
    timeout 60 $R --backend $be --model $W/$model.gguf --rank $r --world $world --store $W/st_$name \
      --prefix $name --out $W/$name.json --gen 8 --threads 4 "$@" >"$LOG/$name.$r.log" 2>&1 &
    pids+=($!)
  done
  for r in "${!pids[@]}"; do
    wait ${pids[$r]} || { ok=1; echo "  $name rank $r failed: $(tail -2 "$LOG/$name.$r.log" | tr '\n' ' ')"; }
  done
  return $ok
}

# compare REF GOT WORLD BOUND LABEL: every logit of every step (both runs fed the same tokens,
# --follow), max |Δ| / max |ref logit|, per step; the argmax tokens; each rank's plan and memory.
compare() {
  python3 - "$W/$1.json" "$W/$2.json" "$3" "$4" "$5" <<'PY'
import json, sys
ref, got, world, bound, label = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
a = json.load(open(got)); b = json.load(open(ref))
if len(a['logits']) != len(b['logits']):
    print(f"  {label}: {len(a['logits'])} logit steps vs {len(b['logits'])}"); sys.exit(1)
ma = max(abs(y) for sb in b['logits'] for y in sb)
per = []
for sa, sb in zip(a['logits'], b['logits']):
    if len(sa) != len(sb):
        print(f"  {label}: step sizes {len(sa)} vs {len(sb)}"); sys.exit(1)
    per.append(max(abs(x - y) for x, y in zip(sa, sb)) / ma)
rel = max(per)
ta, tb = sum(a['tokens'], []), sum(b['tokens'], [])
agree = sum(x == y for x, y in zip(ta, tb))
same_tok = agree == len(tb)
same_ranks = True  # every rank of the group reports the same tokens (always required)
for r in range(1, world):
    o = json.load(open(got + '.' + str(r)))
    same_ranks &= o['tokens'] == a['tokens']
# Argmax agreement with the reference is required at the f32 bound only: the quantized random
# models have near-tied logits, where a 1e-2 difference may flip an argmax (every run is fed the
# reference tokens anyway, so one flip does not propagate).
ok = ma > 0.1 and rel < bound and same_ranks and (same_tok or bound >= 1e-2)
print(f"  {label}: max rel |dlogit| {rel:.2e} (bound {bound:g}; prefill {per[0]:.1e}, decode "
      f"{max(per[1:] or [0]):.1e}), argmax tokens {agree}/{len(tb)} agree"
      f"{'' if same_ranks else ', ranks DIFFER'}, decode {a.get('decode_forward_ms', 0.0):.2f} ms/step")
print("    per step rel: " + " ".join(f"{x:.1e}" for x in per))
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

# ---- 0. references: CPU TP = 1 picks the tokens; every other run is fed them (--follow) ----
for m in tp_F32 tp_Q8_0 tiny_F32 tiny_Q8_0; do
  run_group cpu $m 1 cpu_$m || fail "$m cpu tp1 reference"
  run_group cuda $m 1 ref_$m --follow $W/cpu_$m.json || fail "$m cuda tp1 reference"
  run_group cuda $m 1 nog_$m --follow $W/cpu_$m.json --no-graphs || fail "$m cuda tp1 no-graphs"
  grep -h "CUDA memory plan" "$LOG/ref_$m.0.log" | sed "s/^/  $m tp1: /"
done

# ---- 1. CUDA TP = 1 vs CPU TP = 1 (check_gpu_vs_cpu.sh's F32 bound 2e-3), graphs on / off ----
# (Quantized models: informational; int8 activations and bf16 prefill operands on the GPU.)
for m in tp_F32 tp_Q8_0 tiny_F32 tiny_Q8_0; do
  for v in ref nog; do
    [ -f $W/${v}_$m.json ] && [ -f $W/cpu_$m.json ] || continue
    if [ ${m#*_} = F32 ]; then
      out=$(compare cpu_$m ${v}_$m 1 2e-3 "$m cuda tp1 ($v) vs cpu tp1")
      if [ $? = 0 ]; then pass "$(echo "$out" | head -1 | sed 's/^  //')"; else fail "$(echo "$out" | head -1 | sed 's/^  //')"; fi
    else
      out=$(compare cpu_$m ${v}_$m 1 1e9 "info: $m cuda tp1 ($v) vs cpu tp1"); echo "$out" | head -1
    fi
    echo "$out" | sed -n 2p
  done
done
# The single-sequence path of check_gpu_vs_cpu.sh with these binaries (deltaserve logits).
IDS=1,5,9,200,300,17,42,77,11,3,99,150,400,2,8,64,128,255,31,7,190,230,12,88,45,66,101,250,3,4,5,6,7
if $B logits --model $W/tiny_F32.gguf --prompt-ids $IDS --out $W/lc.f32 --backend cpu 2>/dev/null &&
   $B logits --model $W/tiny_F32.gguf --prompt-ids $IDS --out $W/lg.f32 --backend cuda 2>/dev/null; then
  python3 - $W/lc.f32 $W/lg.f32 <<'PY'
import array, sys
c = array.array('f'); g = array.array('f')
c.frombytes(open(sys.argv[1], 'rb').read()); g.frombytes(open(sys.argv[2], 'rb').read())
print(f"  info: deltaserve logits tiny_F32 cuda vs cpu (1 seq, 33 rows): max rel "
      f"{max(abs(x - y) for x, y in zip(c, g)) / max(abs(x) for x in c):.2e}")
PY
fi

# ---- 2. CUDA TP = W vs CUDA TP = 1 (same tokens fed) ----
check() {  # check MODEL WORLD NAME BOUND [flags...]
  local model=$1 world=$2 name=$3 bound=$4; shift 4
  if run_group cuda $model $world $name --follow $W/cpu_$model.json "$@"; then
    local out s l
    out=$(compare ref_$model $name $world $bound "$model tp$world${*:+ $*}")
    s=$?
    l=$(echo "$out" | head -1 | sed 's/^  //')
    if [ $s = 0 ]; then pass "$l"; else fail "$l"; fi
    echo "$out" | tail -n +2
    compare cpu_$model $name 1 1e9 "vs cpu tp1" | head -1 | sed 's/^  /    /'
  else
    fail "$model tp$world${*:+ $*} (a rank failed; logs $LOG/$name.*.log)"
  fi
}
F=1e-4; Q=5e-2
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

# ---- 4. TP = 1 NCCL regression ----
if [ -x $BIN/tp_nccl_test ]; then
  if timeout 60 $BIN/tp_nccl_test >"$LOG/tp_nccl_test.log" 2>&1 && ! grep -q SKIPPED "$LOG/tp_nccl_test.log"; then
    pass "tp_nccl_test ($(grep -E '^\[  PASSED' "$LOG/tp_nccl_test.log"))"
  else
    fail "tp_nccl_test"; grep -E "FAILED|Failure|Expected|Which is" "$LOG/tp_nccl_test.log" | head -20
  fi
fi

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
for i in $(seq 1 60); do
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

rm -rf $W
[ $rc = 0 ] && echo "tp_cuda_check: ALL PASS" || echo "tp_cuda_check: SOME FAILED (logs in $LOG)"
exit $rc
