#!/usr/bin/env bash
# MTP decodes sent ahead (issue #15, docs/async_scheduling.md "With MTP"): the whole cluster
# (scheduler + CUDA worker with --mtp 3 + gateway, the 27B Q6_K synth) under `deltactl load` at
# one stream and four, with the scheduler's --lookahead on and off: mean step (a verify + drafts),
# the worker's share, and the control overhead per step, from cluster_run.sh.
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h3 DS_PACK_OUT=.devcarry-lead bash tools/device/pack.sh deltaserve deltactl):
#   DS_CARRY=.devcarry-lead bash tools/device/mtp_lookahead_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
for la in ${LOOKAHEAD:-on off}; do
  echo "=== --lookahead $la, worker --mtp ${MTP:-3}"
  SCHED_ARGS="--lookahead $la" WORKER_ARGS="--mtp ${MTP:-3}" CONCS="${CONCS:-1 4}" \
    OUT="${OUT:-/tmp}/lookahead_$la" bash tools/device/cluster_run.sh 2>&1 |
    grep -E "health|concurrency|tok/s|scheduler:|TTFT|inter|MTP|per step" | head -30
done
