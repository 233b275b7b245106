#!/usr/bin/env bash
# Same-call A/B of two deltaserve binaries on the demo model end to end: `deltaserve generate
# --model demo --backend cuda --max-tokens 256 --json --mtp K` for each K in $MTP_K and each
# prompt, alternated A, B for $ROUNDS rounds; prints tok/s, tokens per verify and acceptance, and
# checks that A and B wrote the same text. B is the carried build ($BIN/deltaserve), A the
# binary carried xz-packed alone ($A_XZ; it uses B's shared libraries), as in ab_bench.sh.
# Usage (device, repo root; packed gtest binaries to run first in $TESTS):
#   DS_CARRY=.devcarry-lead A_XZ=.devcarry-main/deltaserve.xz [MTP_K="off 4"] [ROUNDS=2] \
#     bash tools/device/demo_gen_ab.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
ab_setup
PROMPTS=("The jury said that" "In the spring of that year")
for r in $(seq 1 "${ROUNDS:-2}"); do
  for p in "${!PROMPTS[@]}"; do
    for k in ${MTP_K:-off 4}; do
      for side in A B; do
        b=$A
        [ $side = B ] && b=$BIN/deltaserve
        f=$L/gen_${side}_p${p}_$k.json
        timeout 60 "$b" generate --model demo --backend cuda --max-tokens 256 --prompt "${PROMPTS[$p]}" \
          --json --mtp "$k" >"$f" 2>"$L/gen.err" || { fail "generate $side"; tail -3 "$L/gen.err"; }
        echo "$side round $r prompt $p mtp $k: $(gen_summary "$f")"
      done
      python3 -c 'import json,sys; a,b=(json.load(open(f))["text"] for f in sys.argv[1:]); print("same text A/B:", a == b)' \
        "$L/gen_A_p${p}_$k.json" "$L/gen_B_p${p}_$k.json"
    done
  done
done
exit $rc
