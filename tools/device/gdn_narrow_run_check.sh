#!/usr/bin/env bash
# The GDN run kernel's forms for narrow heads (GdnDecodeArgs::narrow_run_form, issue #15: the
# demo model's k = 4 verify runs six of them, ~74 of its ~196 us): spec_kernels_cuda_test (every
# form bit for bit the chain of one-token launches), then the demo's `bench --mtp 4` with
# `--gdn-narrow-run 0 | 1 | 2` alternated ROUNDS times (decode tg and the MTP row: decode,
# verify(dev), cycle and deferred cycle in ms).
# Here: DS_PACK_XZ=1 DS_PACK_BUILD=build-dev DS_PACK_OUT=.devcarry-nr bash tools/device/pack.sh \
#   deltaserve spec_kernels_cuda_test
# On the device: DS_CARRY=.devcarry-nr [ROUNDS=3] [FORMS="0 1 2"] bash tools/device/gdn_narrow_run_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
run_gtest spec_kernels_cuda_test
for r in $(seq 1 "${ROUNDS:-3}"); do
  for f in ${FORMS:-0 1 2}; do
    "$BIN/deltaserve" bench --model demo --quick --mtp 4 --mtp-conc 1 --mtp-depth 64 --no-profile \
      --gdn-narrow-run "$f" >"$L/bench_$f.out" 2>&1 || fail "bench --gdn-narrow-run $f"
    echo "round $r form $f: $(grep -E "^ +4 +1 " "$L/bench_$f.out" | head -1 | tr -s ' ') |" \
      "$(grep -E "^decode tg" "$L/bench_$f.out" | head -1 | tr -s ' ')"
  done
done
grep -E "cycle|verify" "$L/bench_0.out" | head -4
exit $rc
