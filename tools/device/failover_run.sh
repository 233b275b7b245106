#!/usr/bin/env bash
# Replica failover on the GPU (issue #13): the replica tests of tests/cluster/replica_test.cc with
# two CUDA workers of the 27B Q6_K file on the one GPU — placement, kill -9 of a replica
# mid-stream (4 streams: every request completes, greedy and seeded tokens equal to an
# uninterrupted run, longest gap between two messages < 1 s), SIGSTOP (detected within 3 s),
# SIGTERM (a graceful leave), `serve --workers 2` restarting a killed worker, and `serve --tp 2` (two
# CUDA ranks on GPU 0 over the host-staged Gloo collective) losing a rank and re-forming.
# Usage (device, repo root, after `DS_PACK_XZ=1 tools/device/pack.sh deltaserve replica_test`):
#   bash tools/device/failover_run.sh     (MODEL=/tmp/q6k-27b.gguf is synthesized when missing)
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
MODEL=${MODEL:-/tmp/q6k-27b.gguf}
[ -f "$MODEL" ] || "$BIN/deltaserve" gguf-synth --out "$MODEL" --preset 27b --type Q6_K 2>&1 | tail -1
export DS_DELTASERVE_BIN=$PWD/$BIN/deltaserve DS_CLUSTER_MODEL=$MODEL DS_CLUSTER_BACKEND=cuda
"$BIN/replica_test" --gtest_color=no \
  --gtest_filter='Replicas.TwoWorkers*:Replicas.Kill*:Replicas.Stopped*:Replicas.Terminated*:ServeReplicas.*' 2>&1 | tee "${OUT:-/tmp}/failover.log"
rc=${PIPESTATUS[0]}
grep -E "replica loss noticed|max gap|tp group|serve: |^\[  (PASSED|FAILED)" "${OUT:-/tmp}/failover.log"
exit $rc
