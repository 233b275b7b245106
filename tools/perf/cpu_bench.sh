#!/usr/bin/env bash
# CPU backend speed (docs/perf/cpu.md): prefill of a 256-token prompt and 128 decoded tokens,
# 5 runs each, median reported: the embedded tiny model in F32 and Q8_0, and the trained demo
# model (F16, the quick start's default) without and with MTP (--mtp 3).
# Usage: tools/perf/cpu_bench.sh [path/to/deltaserve]
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build/tools/deltaserve}
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
IDS=$(python3 -c "print(','.join(str((i*37)%500+3) for i in range(256)))")
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); load: $(cut -d' ' -f1-3 /proc/loadavg)"
row() {  # row LABEL MODEL [generate flags...]
  local label=$1 model=$2
  shift 2
  for i in 1 2 3 4 5; do
    "$B" generate --model "$model" --prompt-ids "$IDS" --max-tokens 128 --ignore-eos --json --backend cpu "$@"
  done | python3 -c "
import json, sys, statistics as s
rows = [json.loads(l) for l in sys.stdin]
p = s.median(r['prompt_tokens_per_second'] for r in rows)
d = s.median(r['generation_tokens_per_second'] for r in rows)
print(f'$label: prefill 256 tok {p:8.0f} tok/s   decode 128 tok {d:6.0f} tok/s   (median of {len(rows)})')"
}
for t in F32 Q8_0; do
  "$B" gguf-synth --preset tiny --type $t --seed 1 --out "$W/tiny_$t.gguf" 2>/dev/null
  row "tiny $t" "$W/tiny_$t.gguf"
done
row "demo F16" demo
row "demo F16 --mtp 3" demo --mtp 3
