#!/usr/bin/env bash
# Exact failover replay on the GPU (issue #13): batch_invariance_test (decode rows and
# decode_path runs equal decoding alone, bit for bit, on synthetic models of several weight types
# and 4 layers of the 27B width), then the replica failover tests with two CUDA replicas of the
# 27B Q6_K file (tools/device/failover_run.sh: greedy and seeded tokens now asserted equal to the
# uninterrupted run), then the decode bench with batch-invariant decode on and off (its cost).
# Usage (device, repo root, after
#   DS_PACK_XZ=1 tools/device/pack.sh deltaserve replica_test batch_invariance_test):
#   bash tools/device/replay_exact_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
MODEL=${MODEL:-/tmp/q6k-27b.gguf}
"$BIN/batch_invariance_test" --gtest_color=no 2>&1 | tail -25
[ "${PIPESTATUS[0]}" = 0 ] && pass batch_invariance_test || fail batch_invariance_test
[ -f "$MODEL" ] || "$BIN/deltaserve" gguf-synth --out "$MODEL" --preset 27b --type Q6_K 2>&1 | tail -1
MODEL=$MODEL bash tools/device/failover_run.sh && pass failover_run || fail failover_run
for bi in on off; do
  echo "== bench, batch-invariant $bi"
  "$BIN/deltaserve" bench --model "$MODEL" --prefill 512 --decode 48 --depth 0 --conc 1,16,64 \
    --conc-gen 32 --no-profile --batch-invariant $bi 2>&1 | grep -vi "^load\|progress" | tail -12
done
exit $rc
