#!/usr/bin/env bash
# The defaults set from the 2026-12-05 measurements, checked as shipped: the batched GDN decode's
# bulk-copy form (CudaBackendOptions::gdn_bulk_state) and deferred MTP drafts (`--deferred-drafts`
# on for generate / worker / serve). 1. the GPU tests that cover them (GDN launch forms, batch
# invariance); 2. `generate --model demo --mtp 4` with the default and with
# `--deferred-drafts off`, two rounds (the same text throughout); 3. the served demo
# (demo_served_mtp.sh, default worker flags); 4. `deltaserve bench` on the 27B Q6_K synth with
# the defaults and with `--gdn-bulk off`.
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-dev DS_PACK_OUT=.devcarry-lead bash tools/device/pack.sh \
#     deltaserve deltactl gdn_launch_cuda_test batch_invariance_test):
#   DS_CARRY=.devcarry-lead bash tools/device/defaults_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
O=${OUT:-/tmp/out}
L=$O/logs
mkdir -p "$L"
M=${MODEL:-/tmp/m.gguf}
synth_27b "$M" &
synth=$!
for t in ${TESTS:-gdn_launch_cuda_test batch_invariance_test}; do
  run_gtest $t
done
demo_generate_rounds 2 "4" "4 --deferred-drafts off"
TAG=defaults MTPS="off 4" ROUNDS=1 LOAD=0 bash tools/device/demo_served_mtp.sh
wait $synth
for f in on off; do
  echo "== 27B bench --gdn-bulk $f"
  timeout 200 "$BIN/deltaserve" bench --model "$M" --prefill 512 --decode 16 --depth 0 \
    --conc 1,16,64 --conc-gen 32 --no-profile --gdn-bulk $f 2>&1 |
    grep -E "aggregate decode|decode tg|pp512" | sort -u
done
exit $rc
