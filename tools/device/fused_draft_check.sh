#!/usr/bin/env bash
# Issue #15's demo-model row with the fused draft chain (kernels/cuda/mtp_chain.cuh): the MTP
# tests (the new FusedDraftChain test among them), then the trained demo model end to end and in
# the bench with the chain fused (default) and per kernel (`--fused-draft off`), alternated.
#   1. mtp_gpu_test;
#   2. `deltaserve generate --model demo --backend cuda --max-tokens 256 --mtp off|3|4`, fused
#      and not, two rounds;
#   3. `deltaserve bench --model demo --quick --mtp 3,4 --mtp-conc 1 --mtp-depth 64` with
#      `--fused-draft off`, on, and on with BLOCKS (default "32 64") blocks.
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h3 DS_PACK_OUT=.devcarry-lead bash tools/device/pack.sh deltaserve mtp_gpu_test):
#   DS_CARRY=.devcarry-lead bash tools/device/fused_draft_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
O=${OUT:-/tmp/out}
L=$O/logs
mkdir -p "$L"
PROMPT="The jury said that"
[ "${TESTS:-1}" = 1 ] && run_gtest mtp_gpu_test
for rep in 1 2; do
  for run in "off" "3 --fused-draft off" "3" "4 --fused-draft off" "4"; do
    tag=${run// /_}
    timeout 60 "$BIN/deltaserve" generate --model demo --backend cuda --max-tokens 256 \
      --prompt "$PROMPT" --json --mtp $run >"$L/gen_${tag}_$rep.json" 2>"$L/gen_${tag}_$rep.err"
    r=$?
    echo "generate --mtp $run (run $rep): rc=$r $(gen_summary "$L/gen_${tag}_$rep.json")"
    [ $r = 0 ] && pass "generate mtp $run" || { fail "generate mtp $run"; tail -3 "$L/gen_${tag}_$rep.err"; }
  done
done
# Greedy text is the same with and without MTP, fused or not.
python3 - "$L" <<'PY'
import json, sys, glob
texts = {}
for f in sorted(glob.glob(sys.argv[1] + "/gen_*.json")):
    try: texts[f] = json.load(open(f)).get("text")
    except Exception as e: texts[f] = "unreadable: %s" % e
print("greedy texts identical across runs:", len(set(texts.values())) == 1, "(%d runs)" % len(texts))
PY
for fd in "--fused-draft off" "" ${BLOCKS:-32 64}; do
  case "$fd" in [0-9]*) fd="--fused-draft-blocks $fd" ;; esac
  echo "== bench $fd"
  timeout 120 "$BIN/deltaserve" bench --model demo --quick --mtp 3,4 --mtp-conc 1 \
    --mtp-depth 64 --no-profile $fd 2>&1 | tee "$L/bench_${fd// /_}.log" |
    grep -E "decode|^ k streams|^ [0-9] +[0-9]+ " | head -12
done
exit $rc
