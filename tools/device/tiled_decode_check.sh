#!/usr/bin/env bash
# Whole-model decode check of the tiled Q6_K path on the GPU, step by step (device machine, repo
# root, after `DS_PACK_XZ=1 bash tools/device/pack.sh deltaserve ds_tp_rank`):
# a 4-layer model of the 27B width (K % 256 == 0, so the tiled layout is used) runs one prefill step
# of two sequences and 6 decode steps on the CPU backend (the reference: it picks the tokens), then
# on the CUDA backend with the tiled layout and with the raw layout (DS_TILED=0), each with and
# without decode CUDA graphs, all fed the CPU's tokens (--follow), and prints max |Δlogit| / max
# |logit| per step for every pair. Expected: tiled vs raw ~1e-6 (same int8 products, different
# float summation order), each vs CPU ~1e-2 (int8 activations), flat across the decode steps.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
R=${BIN:-.devcarry/bin}/ds_tp_rank; B=${BIN:-.devcarry/bin}/deltaserve; W=$(mktemp -d)
"$B" gguf-synth --preset 27b --layers 4 --type Q6_K --out $W/m.gguf 2>/dev/null || exit 1
run() {  # name backend [flags]
  local n=$1 be=$2; shift 2
  timeout 300 $R --backend $be --model $W/m.gguf --rank 0 --world 1 --store $W/s_$n --prefix $n \
    --out $W/$n.json --gen 6 --threads 16 --prompt 24 --prompt2 9 "$@" > $W/$n.log 2>&1 ||
    { echo "$n failed: $(tail -2 $W/$n.log | tr '\n' ' ')"; return 1; }
}
run cpu cpu || exit 1
DS_TILED=1 run til cuda --follow $W/cpu.json
DS_TILED=0 run raw cuda --follow $W/cpu.json
DS_TILED=1 run til_ng cuda --follow $W/cpu.json --no-graphs
DS_TILED=0 run raw_ng cuda --follow $W/cpu.json --no-graphs
python3 - $W <<'PY'
import json, os, sys
w = sys.argv[1]
L = {k: json.load(open(f"{w}/{k}.json")) for k in ["cpu", "til", "raw", "til_ng", "raw_ng"]
     if os.path.exists(f"{w}/{k}.json")}
def per_step(a, b):
    A, Bb = L[a]['logits'], L[b]['logits']
    ma = max(abs(y) for s in Bb for y in s)
    return [max(abs(x - y) for x, y in zip(sa, sb)) / ma for sa, sb in zip(A, Bb)]
for a, b in [("til", "raw"), ("til_ng", "raw_ng"), ("til", "til_ng"), ("raw", "raw_ng"),
             ("til", "cpu"), ("raw", "cpu")]:
    if a in L and b in L:
        print(f"{a:7s} vs {b:7s} per step (prefill, decode...): "
              + " ".join(f"{x:.1e}" for x in per_step(a, b)))
PY
rm -rf $W
