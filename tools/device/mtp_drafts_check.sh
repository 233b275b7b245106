#!/usr/bin/env bash
# Issue #15, drafts per verify on the CUDA backend: mtp_gpu_test (its draft chain test drafts
# sampling::kMaxMtpDrafts = 15 in its last round), then the demo model's `generate` at every draft
# count worth comparing, `auto` (up to 4 drafts at one stream since 2026-12-07) and the counts the
# chain could not take before (10, 15), ROUNDS rounds each (default 2).
# Here: DS_PACK_XZ=1 DS_PACK_BUILD=build-dev DS_PACK_OUT=.devcarry-k bash tools/device/pack.sh
# deltaserve mtp_gpu_test; on the device: DS_CARRY=.devcarry-k bash tools/device/mtp_drafts_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
run_gtest mtp_gpu_test
demo_generate_rounds "${ROUNDS:-2}" off 3 4 auto 6 10 15
exit $rc
