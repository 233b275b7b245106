#!/usr/bin/env bash
# Issue #15's demo-model row with deferred drafts (MtpSpeculatorOptions::deferred_drafts,
# Backend::MtpDraftDeferred): the verify reads the drafts where the chain left them, so the host
# waits once per MTP cycle instead of twice. Same tokens; the question is the cycle's time.
#   1. mtp_gpu_test (MtpDeferred.SameTokensAndAcceptanceAsWaitedForDrafts among them);
#   2. `deltaserve generate --model demo --backend cuda --max-tokens 256 --mtp off|3|4`, with
#      `--deferred-drafts off` and `on`, alternated, ROUNDS (default 3) rounds, greedy, then the
#      same with sampling (temperature 0.8); SERVED_ROUNDS (1) and BENCH_ROUNDS (1) below;
#   3. (SERVED=1, the default) the served path: demo_served_mtp.sh with MTPS="off 4", once with
#      the worker's drafts waited for and once with `--deferred-drafts on` (needs deltactl);
#   4. `deltaserve bench --model demo --quick --mtp 3,4 --mtp-conc 1 --mtp-depth 64`: its
#      "cycle" and "deferred" columns are the two forms of the draft-chain cycle.
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-dev DS_PACK_OUT=.devcarry-lead bash tools/device/pack.sh deltaserve deltactl mtp_gpu_test):
#   DS_CARRY=.devcarry-lead bash tools/device/deferred_drafts_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
O=${OUT:-/tmp/out}
L=$O/logs
mkdir -p "$L"
PROMPT="The jury said that"
[ "${TESTS:-1}" = 1 ] && run_gtest mtp_gpu_test
for temp in 0 0.8; do
  for rep in $(seq 1 "${ROUNDS:-3}"); do
    for run in "off" "3 --deferred-drafts off" "3 --deferred-drafts on" \
               "4 --deferred-drafts off" "4 --deferred-drafts on"; do
      tag="t${temp}_${run// /_}"
      timeout 60 "$BIN/deltaserve" generate --model demo --backend cuda --max-tokens 256 \
        --prompt "$PROMPT" --json --temperature "$temp" --seed 7 --mtp $run \
        >"$L/gen_${tag}_$rep.json" 2>"$L/gen_${tag}_$rep.err"
      r=$?
      echo "T=$temp generate --mtp $run (run $rep): rc=$r $(gen_summary "$L/gen_${tag}_$rep.json")"
      [ $r = 0 ] && pass "generate T=$temp mtp $run" ||
        { fail "generate T=$temp mtp $run"; tail -3 "$L/gen_${tag}_$rep.err"; }
    done
  done
done
# Per temperature the text is the same with and without MTP, deferred or not (sampled: per seed).
python3 - "$L" <<'PY'
import json, sys, glob
for temp in ("0", "0.8"):
    texts = {}
    for f in sorted(glob.glob(sys.argv[1] + "/gen_t%s_*.json" % temp)):
        try: texts[f] = json.load(open(f)).get("text")
        except Exception as e: texts[f] = "unreadable: %s" % e
    print("T=%s texts identical across runs:" % temp, len(set(texts.values())) == 1,
          "(%d runs)" % len(texts))
PY
if [ "${SERVED:-1}" = 1 ]; then
  for rep in $(seq 1 "${SERVED_ROUNDS:-1}"); do
    echo "== served, drafts waited for (run $rep)"
    TAG=waited_$rep MTPS="off 4" ROUNDS=1 LOAD=0 bash tools/device/demo_served_mtp.sh
    echo "== served, --deferred-drafts on (run $rep)"
    TAG=deferred_$rep MTPS="off 4" ROUNDS=1 LOAD=0 WORKER_ARGS="--deferred-drafts on" \
      bash tools/device/demo_served_mtp.sh
  done
fi
for rep in $(seq 1 "${BENCH_ROUNDS:-1}"); do
  echo "== bench (run $rep)"
  timeout 120 "$BIN/deltaserve" bench --model demo --quick --mtp 3,4 --mtp-conc 1 \
    --mtp-depth 64 --no-profile 2>&1 | tee "$L/bench_$rep.log" |
    grep -E "^ k streams|^ [0-9] +[0-9]+ " | head -6
done
exit $rc
