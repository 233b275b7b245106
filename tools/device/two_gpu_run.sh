#!/usr/bin/env bash
# Issue #20 on TWO GPUs in one device call (kind nvidia-h200-x2: GPUs 0 and 1 over NVLink), every
# point of the issue, each step under `timeout` inside one budget (BUDGET, default 560 s, so the
# call ends before its 10-minute limit); a failing or timed-out step does not stop the others.
# The 27B-shape Q6_K file is synthesized in the background at the start (MODEL, default
# /tmp/q6k-27b.gguf; ~40 s) while point 5's small models run.
#   P1  `deltaserve bench` TP = 2 (ranks on GPUs 0, 1, the default custom IPC all-reduce) vs TP = 1
#       on the 27B file, every row (prefill pp512 / pp2048 / pp8192, decode 1 stream, aggregate
#       x4 / x16 / x64), the all-reduce per call ([1|16|512, 5120] f32, eager and graph-captured)
#       and its share of a decode token. Targets: decode 1 stream >= 1.6x, x16 >= 1.7x,
#       pp8192 >= 1.7x, graph-captured all-reduce of one 5,120-float row <= 5 us.
#   P2  `deltaserve serve --tp 2 --backend cuda` as a user runs it (rank r on GPU r, collective
#       auto) vs `serve --backend cuda` (one GPU), each driven by `deltactl load` at 1 and 16
#       streams (512-token prompts, 128 tokens): TP2/TP1 of the client's generated tok/s against
#       the same targets as P1 (1 stream >= 1.6x, 16 >= 1.7x); server-side inter-token ratio too.
#   P3  replica_test ServeReplicas.TpGroupLosingARankReformsAndLosesNothing with
#       DS_CLUSTER_TP_GPUS=0,1 DS_CLUSTER_TP_COLLECTIVE=nccl: `serve --tp 2 --gpus 0,1
#       --tp-collective nccl`, kill -9 of rank 1 under 4 greedy streams: rank 0 leaves NCCL < 2 s,
#       serve restarts both ranks and the group re-forms, 4 / 4 complete with the uninterrupted
#       tokens; the longest gap between two messages (restart and reload included) < 10 s.
#   P4  replica_test Replicas.KillOneMidStreamAndEveryRequestCompletesIdentically with
#       DS_CLUSTER_GPUS=0,1 (replica 0 on GPU 0, replica 1 on GPU 1): kill -9 of replica 0 under 4
#       streams (greedy, greedy, seeded, seeded): 4 / 4 complete, identical tokens, gap < 1 s.
#   P5  `ds_tp_rank` TP = 2 (rank r on GPU r, --collective custom, decode graphs on) vs TP = 1
#       (GPU 0), fed TP = 1's tokens (--follow): max |dlogit| / max |logit| within docs/tp.md's
#       bounds (F32 1e-4, quantized 5e-2), greedy equal on F32; tiny_F32, tp_F32 (ds_tp_rank test
#       shape), tiny_Q6_K; P5b the same on the 27B Q6_K file (short prompts, last).
# Output: the per-point details as they run, then "==== two_gpu_run summary ====" with one line
# per point: "P<n> PASS|FAIL|SKIP <what was measured>" (P1/P2: the TP2/TP1 ratios and figures;
# P3/P4: leave time, completed requests, equal tokens, longest gap; P5: the worst ratio per
# model; SKIP: the budget ran out before it), and the tables in the shape of docs/perf/tp.md and
# docs/perf/failover.md (also in tables.md). Full logs under ${OUT:-/tmp}/two_gpu/ (commands.txt:
# every command with its time limit). Exit 1 on any FAIL or SKIP.
# Env: POINTS (default "5 1 4 3 2 5b": order and selection; split over two calls if one runs
# out of time), BUDGET (s), MODEL, DS_CARRY, BENCH_ARGS (replaces P1's row flags), BENCH2 (extra
# flags for a second TP = 2 bench, e.g. "--tp-collective nccl" or "--fuse-norm on"; off by default).
#
# Usage. Here (27 MB xz with these four targets, 2026-12-04; keep it under ~37 MB):
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h3 DS_PACK_OUT=.devcarry-2gpu \
#     bash tools/device/pack.sh deltaserve deltactl ds_tp_rank replica_test
# Device (kind nvidia-h200-x2, carry .devcarry-2gpu, timeout_s 600):
#   DS_CARRY=.devcarry-2gpu bash tools/device/two_gpu_run.sh
# Dry run on a CPU machine (no GPU): the same flow with --backend cpu, the tiny gguf-synth models
# (tiny Q8_0 stands in for the 27B file), Gloo instead of NCCL / the IPC all-reduce, tiny bench
# sizes, binaries from a local build (DRY_BUILD, default build-h3):
#   DRY=cpu bash tools/device/two_gpu_run.sh
# P1 cannot run without CUDA (`bench` is a GPU benchmark): the dry run runs its commands, shows
# their failure, and checks the parsing and summary on a fixture in bench's row format (marked).
set -uo pipefail
cd "$(dirname "$0")/../.."
DRY=${DRY:-}
if [ "$DRY" = cpu ]; then
  # A BIN folder of links to the local build (env.sh unpacks nothing when BIN is set).
  DRY_BUILD=${DRY_BUILD:-build-h3}
  BIN=$(mktemp -d /tmp/two_gpu_bin.XXXXXX)
  for p in tools/deltaserve tools/deltactl/deltactl tests/tp/ds_tp_rank tests/cluster/replica_test; do
    ln -s "$PWD/$DRY_BUILD/$p" "$BIN/$(basename $p)"
  done
fi
source tools/device/env.sh
export NCCL_NVLS_ENABLE=0
case "$BIN" in /*) ;; *) BIN=$PWD/$BIN ;; esac
B=$BIN/deltaserve; C=$BIN/deltactl; R=$BIN/ds_tp_rank; RT=$BIN/replica_test
LOG=${OUT:-/tmp}/two_gpu; mkdir -p "$LOG"; : >"$LOG/commands.txt"
W=$(mktemp -d /tmp/two_gpu_w.XXXXXX)
BUDGET=${BUDGET:-560}
RESERVE=8  # seconds kept for the summary
POINTS=${POINTS:-"5 1 4 3 2 5b"}
SUM=()    # the summary lines
TABLES="$LOG/tables.md"; : >"$TABLES"

if [ "$DRY" = cpu ]; then
  BE=cpu; BEARGS=(--backend cpu --threads 1); TPCOLL=(); P3COLL=gloo
  MODEL=${MODEL:-$W/tiny_Q8_0.gguf}
else
  BE=cuda; BEARGS=(--backend cuda); TPCOLL=(--collective custom); P3COLL=nccl
  MODEL=${MODEL:-/tmp/q6k-27b.gguf}
fi

# run NAME MAX CMD...: CMD under `timeout` (MAX s, or less where the budget ends sooner), its
# output in $LOG/NAME.log; returns CMD's status (124: timed out; 99: skipped, no time left).
run() {
  local name=$1 max=$2 t
  shift 2
  t=$((BUDGET - SECONDS - RESERVE))
  [ $t -gt $max ] && t=$max
  if [ $t -lt 5 ]; then
    echo "skipped: budget spent" >"$LOG/$name.log"
    return 99
  fi
  echo "[+${SECONDS}s, limit ${t}s] $name: $*" >>"$LOG/commands.txt"
  timeout -k 5 $t "$@" >"$LOG/$name.log" 2>&1
}
# limit MAX: the time a background step may take (same rule as run).
limit() {
  local t=$((BUDGET - SECONDS - RESERVE))
  [ $t -gt $1 ] && t=$1
  echo $t
}
note() { echo "  $*"; }
summary() {  # summary LINE: print it now and keep it for the end
  echo "$*"
  SUM+=("$*")
  case "$*" in *" FAIL "* | *" SKIP "*) rc=1 ;; esac
}

echo "two_gpu_run: $(date -u +%FT%TZ), ${DRY:+DRY=$DRY, }budget ${BUDGET} s, points: $POINTS, logs $LOG"
if [ "$DRY" != cpu ]; then
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/  gpu /'
  nvidia-smi topo -m >"$LOG/topo.txt" 2>&1 && sed -n 1,3p "$LOG/topo.txt" | sed 's/^/  topo /'
  echo "  libnccl: $(ls /usr/local/cuda/lib64/libnccl.so* 2>/dev/null | head -1); /dev/shm: $(df -h /dev/shm 2>/dev/null | awk 'NR==2{print $2}')"
  export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
fi

# ---- models: small ones now, the 27B file in the background ----
"$B" gguf-synth --preset tiny --type F32 --seed 3 --out $W/tiny_F32.gguf >/dev/null 2>&1 || echo "  gguf-synth tiny F32 failed"
"$B" gguf-synth --preset tiny --type Q6_K --seed 3 --out $W/tiny_Q6_K.gguf >/dev/null 2>&1 || echo "  gguf-synth tiny Q6_K failed"
"$B" gguf-synth --preset tiny --type Q8_0 --seed 3 --out $W/tiny_Q8_0.gguf >/dev/null 2>&1 || echo "  gguf-synth tiny Q8_0 failed"
"$R" --make-model $W/tp_F32.gguf --shape tp --type F32 >/dev/null 2>&1 || echo "  ds_tp_rank --make-model tp F32 failed"
SYNTH=
if [ ! -s "$MODEL" ] && [ "$DRY" != cpu ]; then
  echo "[+${SECONDS}s] synth: $B gguf-synth --preset 27b --type Q6_K --out $MODEL" >>"$LOG/commands.txt"
  (timeout 200 "$B" gguf-synth --preset 27b --type Q6_K --out "$MODEL.part" >"$LOG/synth.log" 2>&1 &&
    mv "$MODEL.part" "$MODEL") &
  SYNTH=$!
fi
need_model() {
  if [ -n "$SYNTH" ]; then
    wait $SYNTH
    SYNTH=
    echo "  model: $MODEL ($(du -h "$MODEL" 2>/dev/null | cut -f1)) ready at +${SECONDS}s; $(tail -1 "$LOG/synth.log" 2>/dev/null)"
  fi
  [ -s "$MODEL" ]
}
VOCAB=$(( $( "$B" info --model $W/tiny_F32.gguf 2>/dev/null | grep -o 'vocab [0-9]*' | grep -o '[0-9]*' || echo 512) ))

# ---- P5: TP = 2 logits vs TP = 1 (ds_tp_rank) ----
# p5_group NAME MODEL WORLD [flags]: WORLD rank processes at once, rank r on GPU r.
p5_group() {
  local name=$1 model=$2 world=$3 r t pids=() ok=0
  shift 3
  t=$(limit ${P5MAX:-60})
  [ $t -lt 5 ] && return 99
  rm -rf $W/st_$name
  echo "[+${SECONDS}s, limit ${t}s] $name: $R --backend $BE --model $model --world $world $*" >>"$LOG/commands.txt"
  for r in $(seq 0 $((world - 1))); do
    local coll=()
    [ $world -gt 1 ] && coll=("${TPCOLL[@]}")
    timeout -k 5 $t "$R" --backend $BE --model $model --rank $r --world $world --device $r \
      --store $W/st_$name --prefix $name --out $W/$name.json --threads 1 "${coll[@]}" "$@" \
      >"$LOG/$name.$r.log" 2>&1 &
    pids+=($!)
  done
  for r in "${!pids[@]}"; do
    wait ${pids[$r]} || { ok=1; note "$name rank $r failed: $(tail -n 2 "$LOG/$name.$r.log" | tr '\n' ' ')"; }
  done
  return $ok
}
# p5_compare REF GOT BOUND GREEDY(1: argmax tokens must agree) LABEL: prints one line, status 0
# when within the bound.
p5_compare() {
  python3 - "$W/$1.json" "$W/$2.json" "$3" "$4" "$5" <<'PY'
import json, sys
ref, got, bound, greedy, label = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4] == "1", sys.argv[5]
a = json.load(open(got)); b = json.load(open(ref))
if len(a['logits']) != len(b['logits']) or any(len(x) != len(y) for x, y in zip(a['logits'], b['logits'])):
    print(f"{label}: logit shapes differ"); sys.exit(1)
try:
    import numpy as np
    per = [float(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)).max()) for x, y in zip(a['logits'], b['logits'])]
    ma = max(float(np.abs(np.asarray(y)).max()) for y in b['logits'])
except ImportError:
    per = [max(abs(u - v) for u, v in zip(x, y)) for x, y in zip(a['logits'], b['logits'])]
    ma = max(abs(v) for y in b['logits'] for v in y)
per = [p / ma for p in per]
rel = max(per)
ta, tb = sum(a['tokens'], []), sum(b['tokens'], [])
agree = sum(x == y for x, y in zip(ta, tb))
ranks_same = True
try:
    ranks_same = json.load(open(got + '.1'))['tokens'] == a['tokens']
except FileNotFoundError:
    pass
ok = ma > 0.1 and rel < bound and ranks_same and (agree == len(tb) or not greedy)
print(f"{label}: max rel |dlogit| {rel:.2e} (bound {bound:g}; prefill {per[0]:.1e}, decode {max(per[1:] or [0]):.1e}), "
      f"greedy {agree}/{len(tb)}{' (must agree)' if greedy else ''}{'' if ranks_same else ', RANKS DIFFER'}, "
      f"decode {a.get('decode_forward_ms', 0.0):.2f} ms/step vs {b.get('decode_forward_ms', 0.0):.2f} at TP = 1")
sys.exit(0 if ok else 1)
PY
}
# p5_model TAG MODEL BOUND GREEDY [ds_tp_rank flags]: TP = 1 on GPU 0, then TP = 2 fed its tokens.
p5_model() {
  local tag=$1 model=$2 bound=$3 greedy=$4 out s
  shift 4
  p5_group p5_${tag}_tp1 $model 1 "$@"
  s=$?
  [ $s = 99 ] && { echo "SKIP $tag: no time left"; return 99; }
  [ $s != 0 ] && { echo "FAIL $tag: TP = 1 reference did not run (logs $LOG/p5_${tag}_tp1.0.log)"; return 1; }
  p5_group p5_${tag}_tp2 $model 2 --follow $W/p5_${tag}_tp1.json "$@"
  s=$?
  [ $s = 99 ] && { echo "SKIP $tag: no time left"; return 99; }
  [ $s != 0 ] && { echo "FAIL $tag: TP = 2 group did not run (logs $LOG/p5_${tag}_tp2.*.log)"; return 1; }
  grep -h "CUDA memory plan" "$LOG"/p5_${tag}_tp2.*.log 2>/dev/null | sed 's/^/    /' >>"$LOG/p5_memory.txt"
  out=$(p5_compare p5_${tag}_tp1 p5_${tag}_tp2 $bound $greedy "$tag")
  s=$?
  [ $s = 0 ] && echo "PASS $out" || echo "FAIL $out"
  return $s
}
point5() {
  echo "== P5: TP = 2 logits vs TP = 1 ($BE${TPCOLL:+, ${TPCOLL[*]}})"
  local lines=() l ok=PASS worst=""
  l=$(p5_model tiny_F32 $W/tiny_F32.gguf 1e-4 1); lines+=("$l")
  l=$(p5_model tp_F32 $W/tp_F32.gguf 1e-4 1); lines+=("$l")
  l=$(p5_model tiny_Q6_K $W/tiny_Q6_K.gguf 5e-2 0); lines+=("$l")
  for l in "${lines[@]}"; do
    note "$l"
    case "$l" in FAIL*) ok=FAIL ;; SKIP*) [ $ok = PASS ] && ok=SKIP ;; esac
    worst+="${worst:+; }$(echo "$l" | sed -E 's/^(PASS|FAIL) ([^:]*): max rel \|dlogit\| ([^ ]*) \(bound ([^;]*);.*greedy ([0-9]+\/[0-9]+).*/\2 \3 (<\4) greedy \5/')"
  done
  summary "P5 $ok TP2 vs TP1 logits ($BE): $worst"
}
point5b() {
  echo "== P5b: TP = 2 logits vs TP = 1 on $(basename $MODEL)"
  if ! need_model; then summary "P5b FAIL no model ($LOG/synth.log)"; return; fi
  local l t=$(basename "$MODEL" .gguf)
  l=$(P5MAX=180 p5_model big $MODEL 5e-2 0 --prompt 8 --prompt2 4 --gen 4 --ctx 64)
  note "$l"
  local ok=${l%% *}
  summary "P5b $ok TP2 vs TP1 logits, $t: $(echo "$l" | sed -E 's/^(PASS|FAIL|SKIP) big: //')"
}

# ---- P1: bench TP = 2 vs TP = 1 ----
bench_fixture() {  # bench_fixture TP: rows in bench's PrintRow format ("%-34s %12.1f %10.1f %7.1f%%  %s")
  python3 - "$1" <<'PY'
import sys
tp = int(sys.argv[1])
rows = []
if tp == 2:
    rows += [("allreduce 1x5120", 0, 0, 0, "eager 5.68 us, graph 4.07 us per call"),
             ("allreduce 16x5120", 0, 0, 0, "eager 6.65 us, graph 5.20 us per call"),
             ("allreduce 512x5120", 0, 0, 0, "eager 45.53 us, graph 43.56 us per call")]
s = {1: 1.0, 2: 1.75}[tp]
rows += [("prefill pp512", 4507.8 * s, 0, 0, "0.114 s (median of 3; 0.113..0.115)"),
         ("prefill pp2048", 8300.0 * s, 0, 0, "0.247 s (median of 3; 0.246..0.248)"),
         ("prefill pp8192", 9047.0 * s, 0, 0, "0.905 s (median of 3; 0.904..0.906)"),
         ("decode tg128 @0", 123.0 * s, 2700 * s / 2, 63.5, f"{1e3 / (123.0 * s):.2f} ms/token" +
          ("" if tp == 1 else f"; all-reduce 129 x 4.07 us = 0.525 ms/token ({0.525 * 123.0 * s / 10:.1f}%)")),
         ("aggregate decode x4", 411.0 * s, 0, 0, f"{4e3 / (411.0 * s):.2f} ms/step; prompts 0.23 s (8900 tok/s)"),
         ("aggregate decode x16", 1180.0 * s, 0, 0, f"{16e3 / (1180.0 * s):.2f} ms/step; prompts 0.90 s (9100 tok/s)"),
         ("aggregate decode x64", 2050.0 * s, 0, 0, f"{64e3 / (2050.0 * s):.2f} ms/step; prompts 3.60 s (9100 tok/s)")]
print("DRY FIXTURE (not measured): rows in the format of deltaserve bench")
print("\n==== bench summary (fixture) ====")
print("%-34s %12s %10s %8s" % ("test", "tok/s", "GB/s", "of BW"))
for r in rows:
    print("%-34s %12.1f %10.1f %7.1f%%  %s" % r)
PY
}
bench_report() {  # bench_report TP1LOG TP2LOG LABEL: the P1 lines, the table; status 1 if a target is missed
  python3 - "$1" "$2" "$3" "$TABLES" <<'PY'
import re, sys
def rows(path):
    out, lines = {}, open(path, errors='replace').read().splitlines()
    if any(l.startswith('==== bench summary') for l in lines):
        lines = lines[[i for i, l in enumerate(lines) if l.startswith('==== bench summary')][-1]:]
    for l in lines:
        if len(l) < 50 or l.startswith('test '):
            continue
        parts = l[35:].split(None, 3)
        if len(parts) < 3 or not parts[2].endswith('%'):
            continue
        try:
            out[l[:34].strip()] = (float(parts[0]), parts[3] if len(parts) > 3 else '')
        except ValueError:
            pass
    return out
a, b, label, tables = rows(sys.argv[1]), rows(sys.argv[2]), sys.argv[3], sys.argv[4]
if not a or not b:
    print(f"P1 FAIL bench rows missing (TP1 {len(a)} rows, TP2 {len(b)} rows)"); sys.exit(1)
def num(x): return f"{x:,.1f}"
ratio = {k: b[k][0] / a[k][0] for k in a if k in b and a[k][0] > 0}
dec = next((k for k in a if k.startswith('decode tg') and k.endswith('@0')), None)
targets = [(dec, 1.6, 'decode 1 stream'), ('aggregate decode x16', 1.7, 'x16'), ('prefill pp8192', 1.7, 'pp8192')]
ok, parts = True, []
for k, t, name in targets:
    if k in ratio:
        good = ratio[k] >= t; ok &= good
        parts.append(f"{name} {ratio[k]:.2f}x (>={t}{'' if good else ' MISSED'})")
    else:
        ok = False; parts.append(f"{name} missing")
others = [f"{k.replace('prefill ', '').replace('aggregate decode ', '')} {ratio[k]:.2f}x" for k in a if k in ratio and k not in (t[0] for t in targets)]
ar = {}
for k, (_, note) in b.items():
    m = re.match(r'allreduce (\d+)x(\d+)$', k)
    e = re.search(r'eager ([0-9.]+) us, graph ([0-9.]+) us', note)
    if m and e:
        ar[int(m.group(1))] = (int(m.group(2)), float(e.group(1)), float(e.group(2)))
share = re.search(r'all-reduce (\d+) x ([0-9.]+) us = ([0-9.]+) ms/token \(([0-9.]+)%\)', b.get(dec, (0, ''))[1]) if dec else None
if 1 in ar:
    row_us = ar[1][2] if ar[1][2] > 0 else ar[1][1]
    good = row_us <= 5.0; ok &= good
    parts.append(f"all-reduce 1x{ar[1][0]} {row_us:.2f} us ({'graph' if ar[1][2] > 0 else 'eager'}, <=5{'' if good else ' MISSED'})")
else:
    ok = False; parts.append("all-reduce rows missing")
if share:
    parts.append(f"{share.group(1)} per token = {share.group(3)} ms = {share.group(4)}% of a decode token")
print(f"P1 {'PASS' if ok else 'FAIL'} {label}: " + ", ".join(parts) + ("; " + " ".join(others) if others else ""))
# Tables in docs/perf/tp.md's shapes.
n_ar = int(share.group(1)) if share else 0
t = ["", f"### P1 bench, {label}", "", "| row | TP = 1 | TP = 2 (GPUs 0, 1) | TP2 / TP1 |", "|---|---:|---:|---:|"]
for k in a:
    if k not in b:
        continue
    def cell(v):
        tok, note = v
        m = re.match(r'([0-9.]+ ms/(token|step))', note)
        return f"{num(tok)} tok/s" + (f" ({m.group(1)})" if m else "")
    t.append(f"| {k} | {cell(a[k])} | {cell(b[k])} | {ratio.get(k, 0):.2f}x |")
if share:
    t.append(f"| all-reduce share of a decode token | — | {share.group(1)} × {float(share.group(2)):.2f} µs = {share.group(3)} ms ({share.group(4)}%) | |")
if 16 in ar and n_ar and 'aggregate decode x16' in b:
    m = re.match(r'([0-9.]+) ms/step', b['aggregate decode x16'][1])
    if m:
        us = ar[16][2] or ar[16][1]
        t.append(f"| all-reduce share of an x16 step | — | {n_ar} × {us:.2f} µs = {n_ar * us / 1e3:.3f} ms ({100 * n_ar * us / 1e3 / float(m.group(1)):.1f}%) | |")
if ar:
    t += ["", "| rows | message | algorithm | eager | graph-captured |", "|---:|---:|---|---:|---:|"]
    for r, (h, e, g) in sorted(ar.items()):
        by = r * h * 4
        t.append(f"| {r} | {by / 1e6:.2f} MB | {'one-shot' if by < 512 * 1024 else 'two-shot'} (custom) | {e:.2f} µs | {g:.2f} µs |")
open(tables, 'a').write("\n".join(t) + "\n")
print("\n".join("  " + x for x in t if x))
sys.exit(0 if ok else 1)
PY
}
point1() {
  echo "== P1: deltaserve bench --tp 2 vs --tp 1"
  if ! need_model; then summary "P1 FAIL no model ($LOG/synth.log)"; return; fi
  local args=${BENCH_ARGS:-"--prefill 512,2048,8192 --decode 128 --depth 0 --conc 4,16,64 --conc-prompt 512 --conc-gen 128 --no-profile"}
  [ "$DRY" = cpu ] && args=${BENCH_ARGS:-"--prefill 32,64,128 --decode 8 --depth 0 --conc 4,16,64 --conc-prompt 16 --conc-gen 8 --no-profile"}
  run p1_bench_tp1 200 "$B" bench --model "$MODEL" $args; local r1=$?
  run p1_bench_tp2 200 "$B" bench --model "$MODEL" $args --tp 2 --gpus 0,1; local r2=$?
  note "TP = 1 rc $r1, TP = 2 rc $r2 (logs $LOG/p1_bench_tp{1,2}.log)"
  local l1=$LOG/p1_bench_tp1.log l2=$LOG/p1_bench_tp2.log label="27B Q6_K, custom all-reduce"
  if [ "$DRY" = cpu ]; then
    note "DRY: bench is a CUDA benchmark; here TP = 1 said: $(grep -m1 -E 'bench:|error' $l1 | cut -c1-100); TP = 2: $(grep -m1 -E 'bench:|error' $l2 | cut -c1-120)"
    bench_fixture 1 >$LOG/p1_fixture_tp1.log; bench_fixture 2 >$LOG/p1_fixture_tp2.log
    l1=$LOG/p1_fixture_tp1.log; l2=$LOG/p1_fixture_tp2.log; label="DRY FIXTURE, not measured"
  fi
  grep -E "^device|^tensor parallel|^loaded" $l2 2>/dev/null | head -4 | sed 's/^/  tp2: /'
  local out
  out=$(bench_report $l1 $l2 "$label")
  echo "$out" | tail -n +2
  summary "$(echo "$out" | head -1)"
  if [ -n "${BENCH2:-}" ] && [ "$DRY" != cpu ]; then
    run p1_bench_tp2b 200 "$B" bench --model "$MODEL" $args --tp 2 --gpus 0,1 $BENCH2
    out=$(bench_report $l1 $LOG/p1_bench_tp2b.log "27B Q6_K, TP = 2 with $BENCH2")
    echo "$out" | tail -n +2
    summary "$(echo "$out" | head -1 | sed 's/^P1 /P1b /')"
  fi
}

# ---- P2: serve --tp 2 vs serve (one GPU), deltactl load at 1 and 16 streams ----
# serve_load TAG [serve flags]: serve, a warm-up load, then c1 and c16; stops serve.
serve_load() {
  local tag=$1 t addr="" pid i
  shift
  t=$(limit 200)
  [ $t -lt 30 ] && { note "$tag: skipped, budget spent"; return 99; }
  echo "[+${SECONDS}s, limit ${t}s] p2_$tag: $B serve --model $MODEL --port 0 --slots 16 --ctx 16384 ${BEARGS[*]} $*" >>"$LOG/commands.txt"
  timeout -k 15 $t "$B" serve --model "$MODEL" --port 0 --slots 16 --ctx 16384 "${BEARGS[@]}" "$@" \
    >"$LOG/p2_$tag.out" 2>"$LOG/p2_$tag.err" &
  pid=$!
  for i in $(seq 1 $((t - 20))); do
    addr=$(grep -o 'generation  127\.0\.0\.1:[0-9]*' "$LOG/p2_$tag.out" 2>/dev/null | awk '{print $2}')
    [ -n "$addr" ] && break
    kill -0 $pid 2>/dev/null || break
    sleep 1
  done
  if [ -z "$addr" ]; then
    note "$tag: serve did not come up: $(tail -n 3 "$LOG/p2_$tag.err" | tr '\n' ' ' | cut -c1-300)"
    kill $pid 2>/dev/null; wait $pid 2>/dev/null
    return 1
  fi
  note "$tag: serving after ${i} s at $addr$(grep -o 'event=tp_joined.*collective=[^ ]*' "$LOG/p2_$tag.err" | grep -o 'collective=[^ ]*' | sort | uniq -c | awk '{printf ", %s ranks joined with %s", $1, $2}')"
  local plen=512 gen=128 wtok=32
  [ "$DRY" = cpu ] && { plen=64; gen=16; wtok=8; }
  local v=$VOCAB
  [ "$DRY" != cpu ] && v=248000
  run p2_${tag}_warm 60 "$C" load --addr $addr --concurrency 16 --requests 16 --prompt-len 64 --max-tokens $wtok --vocab $v --timeout 60
  run p2_${tag}_c1 60 "$C" load --addr $addr --concurrency 1 --requests 3 --prompt-len $plen --max-tokens $gen --vocab $v --timeout 60
  run p2_${tag}_c16 90 "$C" load --addr $addr --concurrency 16 --requests 32 --prompt-len $plen --max-tokens $gen --vocab $v --timeout 90
  kill -TERM $pid 2>/dev/null
  wait $pid 2>/dev/null
  return 0
}
point2() {
  echo "== P2: serve --tp 2 vs serve (one GPU), deltactl load at 1 and 16 streams"
  if ! need_model; then summary "P2 FAIL no model ($LOG/synth.log)"; return; fi
  local out skipped=0
  serve_load tp1; [ $? = 99 ] && skipped=1
  serve_load tp2 --tp 2; [ $? = 99 ] && skipped=1
  out=$(python3 - "$LOG" "$TABLES" "${DRY:+ (DRY, CPU: ratios meaningless)}" $skipped <<'PY'
import re, sys, os
log, tables, dry, skipped = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == '1'
def load(path):
    if not os.path.exists(path): return None
    t = open(path, errors='replace').read()
    m = re.search(r'requests: (\d+) ok.*\n.*client throughput: ([0-9.]+) generated tok/s', t)
    want = re.search(r'concurrency \d+, (\d+) requests', t)
    itl = re.search(r'mean inter-token \(per req\)\s+([0-9.]+)', t)
    ttft = re.search(r'^\s+TTFT\s+([0-9.]+)', t, re.M)
    if not m: return None
    return dict(ok=int(m.group(1)), want=int(want.group(1)) if want else -1, tps=float(m.group(2)), itl=float(itl.group(1)) if itl else 0.0,
                ttft=float(ttft.group(1)) if ttft else 0.0)
r = {(tp, c): load(f"{log}/p2_{tp}_c{c}.log") for tp in ('tp1', 'tp2') for c in (1, 16)}
ok, parts, rows = True, [], ["", f"### P2 serve + deltactl load{dry}", "",
       "| streams | serve (one GPU) | serve --tp 2 | TP2 / TP1 tok/s | inter-token p50 TP1 / TP2 |", "|---:|---:|---:|---:|---:|"]
for c, target in ((1, 1.6), (16, 1.7)):
    a, b = r[('tp1', c)], r[('tp2', c)]
    if not a or not b:
        ok = False; parts.append(f"{c} stream{'s' if c > 1 else ''}: load missing (tp1 {'ok' if a else 'none'}, tp2 {'ok' if b else 'none'})"); continue
    q = b['tps'] / a['tps']; qi = a['itl'] / b['itl'] if b['itl'] else 0
    done = a['ok'] == a['want'] and b['ok'] == b['want']
    # The dry run (CPU) checks the flow only: every request served; the ratios are not judged.
    good = done and (q >= target or bool(dry)); ok &= good
    mark = '' if good else ' MISSED' if done else f" REQUESTS FAILED ({a['ok']}/{a['want']}, {b['ok']}/{b['want']})"
    parts.append(f"{c} stream{'s' if c > 1 else ''} {a['tps']:.1f} -> {b['tps']:.1f} tok/s = {q:.2f}x "
                 f"(>={target}{' not judged' if dry and done else ''}{mark}; inter-token {qi:.2f}x)")
    rows.append(f"| {c} | {a['tps']:,.1f} tok/s ({a['itl']:.2f} ms/token) | {b['tps']:,.1f} tok/s ({b['itl']:.2f} ms/token) | {q:.2f}x | {qi:.2f}x |")
print(f"P2 {'PASS' if ok else 'SKIP' if skipped else 'FAIL'} serve --tp 2 / serve{dry}: " + "; ".join(parts))
open(tables, 'a').write("\n".join(rows) + "\n")
print("\n".join("  " + x for x in rows if x))
PY
)
  echo "$out" | tail -n +2
  summary "$(echo "$out" | head -1)"
}

# ---- P3 / P4: the failover tests of replica_test against the two cards ----
gtest_result() { grep -E '^\[  (PASSED|FAILED) ' "$1" | tr '\n' ' '; }
# replica_gtest NAME LIMIT FILTER PATTERN [VAR=VALUE...]: replica_test's FILTER as step NAME (run's
# rules) with the cluster's binary and model and the given environment, on the CUDA backend unless
# DRY=cpu; prints the log lines matching PATTERN and any failure. Sets the caller's s (status) and
# f (log).
replica_gtest() {
  local name=$1 max=$2 filter=$3 pattern=$4
  shift 4
  local env=(DS_DELTASERVE_BIN=$B DS_CLUSTER_MODEL=$MODEL "$@")
  [ "$DRY" != cpu ] && env+=(DS_CLUSTER_BACKEND=cuda)
  run "$name" "$max" env "${env[@]}" "$RT" --gtest_color=no --gtest_filter="$filter"
  s=$?
  f=$LOG/$name.log
  grep -E "$pattern|Failure|Expected|Which is" "$f" | head -12 | sed 's/^/  /'
}
point3() {
  echo "== P3: serve --tp 2 --gpus 0,1 --tp-collective $P3COLL, kill -9 of rank 1 under 4 streams"
  if ! need_model; then summary "P3 FAIL no model ($LOG/synth.log)"; return; fi
  local s f out
  replica_gtest p3_tp_kill 300 ServeReplicas.TpGroupLosingARankReformsAndLosesNothing \
    "^serve: |^tp group" DS_CLUSTER_TP_GPUS=0,1 DS_CLUSTER_TP_COLLECTIVE=$P3COLL
  out=$(python3 - "$f" "$s" "$TABLES" "$P3COLL" <<'PY'
import re, sys
t = open(sys.argv[1], errors='replace').read(); st = int(sys.argv[2]); coll = sys.argv[4]
leave = re.search(r'rank 0 left the broken group ([0-9.]+) s', t)
streams = re.findall(r'serve: (\d+) tokens, (\d+) equal to the uninterrupted run before the first difference, max gap between messages ([0-9.]+) s', t)
passed = '[  PASSED  ] 1 test' in t
gap = max((float(g) for _, _, g in streams), default=-1)
eq = ", ".join(f"{e}/{n}" for n, e, _ in streams)
ok = passed and st == 0 and len(streams) == 4 and all(n == e for n, e, _ in streams) and 0 <= gap < 10 and leave and float(leave.group(1)) < 2
why = "" if passed else (" (timed out)" if st == 124 else " (skipped: no time)" if st == 99 else f" (gtest rc {st})")
print(f"P3 {'PASS' if ok else 'SKIP' if st == 99 else 'FAIL'} TP=2 {coll} group, kill -9 of rank 1 under 4 streams{why}: survivor left after "
      f"{leave.group(1) + ' s' if leave else '?'} (<2), {len(streams)}/4 complete, tokens equal {eq or '-'}, "
      f"longest gap {gap:.3f} s (<10, restart + reload included), group re-formed: {'yes' if passed else 'see log'}")
rows = ["", f"### P3 serve --tp 2 --gpus 0,1 --tp-collective {coll}, kill -9 of rank 1", "", "| | kill -9 of rank 1 |", "|---|---:|",
        f"| survivor (rank 0) left the group | {leave.group(1) + ' s' if leave else '?'} |",
        f"| requests completed | {len(streams)} / 4 |",
        f"| tokens equal to the uninterrupted run | {eq} |",
        f"| longest gap between two messages (restart + reload included) | {gap:.3f} s |"]
open(sys.argv[3], 'a').write("\n".join(rows) + "\n")
PY
)
  summary "$out"
}
point4() {
  echo "== P4: two replicas (GPU 0, GPU 1), kill -9 of replica 0 under 4 streams"
  if ! need_model; then summary "P4 FAIL no model ($LOG/synth.log)"; return; fi
  local s f out
  replica_gtest p4_replica_kill 240 Replicas.KillOneMidStreamAndEveryRequestCompletesIdentically \
    "^kill -9: " DS_CLUSTER_GPUS=0,1
  out=$(python3 - "$f" "$s" "$TABLES" <<'PY'
import re, sys
t = open(sys.argv[1], errors='replace').read(); st = int(sys.argv[2])
noticed = re.search(r'replica loss noticed after ([0-9.]+) s', t)
req = re.findall(r'request (\d) \((\w+)\) max gap between messages ([0-9.]+) s, (\d+) tokens, (\d+) equal', t)
passed = '[  PASSED  ] 1 test' in t
gap = max((float(g) for _, _, g, _, _ in req), default=-1)
ok = passed and st == 0 and len(req) == 4 and all(n == e for _, _, _, n, e in req) and 0 <= gap < 1
why = "" if passed else (" (timed out)" if st == 124 else " (skipped: no time)" if st == 99 else f" (gtest rc {st})")
# Placement alternates replica 0, 1, 0, 1: requests 0 and 2 were on the killed replica (replayed).
rep = [g for i, _, g, _, _ in req if int(i) % 2 == 0]; sur = [g for i, _, g, _, _ in req if int(i) % 2 == 1]
eq = ", ".join(f"{e}/{n}" for _, _, _, n, e in req)
print(f"P4 {'PASS' if ok else 'SKIP' if st == 99 else 'FAIL'} replicas on GPU 0 / GPU 1, kill -9 of replica 0 under 4 streams{why}: loss noticed "
      f"{noticed.group(1) + ' s' if noticed else '?'}, {len(req)}/4 complete, tokens equal {eq or '-'}, longest gap {gap:.3f} s (<1)")
rows = ["", "### P4 two replicas, one per card, kill -9 of replica 0", "", "| | kill -9 |", "|---|---:|",
        f"| loss noticed | {noticed.group(1) + ' s' if noticed else '?'} |",
        f"| requests completed | {len(req)} / 4 |",
        f"| tokens equal to the uninterrupted run (greedy, greedy, seeded, seeded) | {eq} |",
        f"| longest gap, replayed streams | {', '.join(s + ' s' for s in rep)} |",
        f"| longest gap, streams of the surviving replica | {', '.join(s + ' s' for s in sur)} |"]
open(sys.argv[3], 'a').write("\n".join(rows) + "\n")
PY
)
  summary "$out"
}

for p in $POINTS; do
  t0=$SECONDS
  case $p in
    1) point1 ;; 2) point2 ;; 3) point3 ;; 4) point4 ;; 5) point5 ;; 5b) point5b ;;
    *) echo "unknown point $p" ;;
  esac
  echo "  (P$p took $((SECONDS - t0)) s; +${SECONDS}s of ${BUDGET})"
done
[ -n "$SYNTH" ] && kill $SYNTH 2>/dev/null

echo
echo "==== two_gpu_run summary (${DRY:+DRY=$DRY, }$((SECONDS)) s, logs $LOG) ===="
for l in "${SUM[@]}"; do echo "$l"; done
echo "(tables for docs/perf/tp.md and docs/perf/failover.md: $TABLES)"
[ $rc = 0 ] && echo "two_gpu_run: ALL PASS" || echo "two_gpu_run: SOME FAILED OR SKIPPED (logs in $LOG)"
rm -rf "$W"
[ "$DRY" = cpu ] && rm -rf "$BIN"
exit $rc
