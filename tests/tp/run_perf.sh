#!/usr/bin/env bash
# Perf runs of docs/perf/tp.md: one CPU TP group of ds_tp_rank processes on perf.gguf (made with
# `ds_tp_rank --make-model perf.gguf --shape perf`), prints per-rank step and collective times.
# usage: run_perf.sh WORLD SPLIT LMHEAD THREADS TAG
B=${DS_TP_RANK:-$(dirname "$0")/../../build-tp/tests/tp/ds_tp_rank}
W=$1; SPLIT=$2; LM=$3; T=$4; TAG=$5
rm -rf st_$TAG
args="--model perf.gguf --world $W --store st_$TAG --prefix $TAG --lm-head $LM --threads $T --prompt 64 --prompt2 16 --gen 32 --no-logits --comm-bench 20 --out perf_$TAG.json"
[ "$SPLIT" != "-" ] && args="$args --split $SPLIT"
for r in $(seq 1 $((W-1))); do $B $args --rank $r 2>/dev/null & done
$B $args --rank 0 2>/dev/null
wait
python3 - "$TAG" "$W" <<'PY'
import json,sys
tag,W=sys.argv[1],int(sys.argv[2])
for r in range(W):
    p='perf_%s.json'%tag+('' if r==0 else '.%d'%r)
    j=json.load(open(p))
    st=j['steps'][1:]
    # median decode step
    f=sorted(s['forward_s'] for s in st); c=sorted(s['comm_s'] for s in st)
    print("%-14s rank %d: bench decode %.2f ms prefill %.2f ms"%(tag,r,j.get("bench_decode_comm_ms",0),j.get("bench_prefill_comm_ms",0)))
    print("%-14s rank %d: prefill %.1f ms (comm %.1f ms, %.0f%%) | decode mean %.2f ms/step, comm %.2f ms (%.0f%%), median step %.2f ms comm %.2f ms"%(
      tag,r,j['prefill_forward_ms'],j['prefill_comm_ms'],100*j['prefill_comm_ms']/j['prefill_forward_ms'],
      j['decode_forward_ms'],j['decode_comm_ms'],100*j['decode_comm_ms']/j['decode_forward_ms'],1e3*f[len(f)//2],1e3*c[len(c)//2]))
PY
