#!/usr/bin/env bash
# Tiled Q4_K / Q5_K / Q8_0 / IQ4_XS / IQ4_NL on the f16 tensor-core kernel (issue #22, CudaBackendOptions::
# tiled_f16_formats, `bench --tiled-f16-formats on|off`): the kernel tests (repack, tiled
# dequantization, sub-block sums, the kernel vs its CPU reference), the Q6_K f16 kernel's own test
# (its code was templated), the whole-model cases against the CPU and batch invariance, the
# per-launch table (f16 kernel vs the v2 GEMV on raw rows), then `deltaserve bench` on the 27B
# synth of each of TYPES (default TYPE, default Q4_K; any of Q4_K Q5_K Q8_0 IQ4_XS IQ4_NL, made in
# parallel during the tests; one stream, x16, x64) with each setting, alternated.
# Usage (device, repo root). The binaries do not fit one call's 64 MiB with the sources (53 MB
# packed, 2026-12-05), so two calls:
#   1. here: DS_PACK_XZ=1 DS_PACK_BUILD=build-dev DS_PACK_OUT=.devcarry-lead bash \
#        tools/device/pack.sh deltaserve tiled_formats_cuda_test   (31 MB)
#      device: DS_CARRY=.devcarry-lead [ROUNDS=2] [TYPES="Q4_K Q5_K"] bash tools/device/tiled_formats_check.sh
#   2. here: ... DS_PACK_OUT=.devcarry-t bash tools/device/pack.sh gpu_vs_cpu_test \
#        batch_invariance_test tiled_f16_cuda_test   (36 MB)
#      device: DS_CARRY=.devcarry-t ROUNDS=0 bash tools/device/tiled_formats_check.sh
# (run_gtest skips a binary that was not packed; ROUNDS=0 skips the bench.) The 27B synths take
# the device's /tmp (64 GB disk): Q8_0 28.7 GB, IQ4_* ~15 GB, Q4_K / Q5_K 15-19 GB; two types per
# call fit (2026-12-05: "Q8_0 IQ4_NL", then "Q4_K Q5_K"; the script deletes other types' files).
# Since e86d251 the tiles are the default: the bench's `off` row is the A/B.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
TYPES=${TYPES:-${TYPE:-Q4_K}}
# A warm machine keeps the last call's synths: drop those of other types (the disk holds ~64 GB).
for f in /tmp/m_*.gguf; do [ -e "$f" ] && ! [[ " $TYPES " == *" $(basename "$f" .gguf | cut -c3-) "* ]] && rm -f "$f"; done
if [ "${ROUNDS:-2}" != 0 ]; then for T in $TYPES; do synth_27b "/tmp/m_$T.gguf" "$T" & done; fi

run_gtest tiled_formats_cuda_test
run_gtest tiled_f16_cuda_test --gtest_filter='TiledF16.*'
run_gtest batch_invariance_test
run_gtest gpu_vs_cpu_test --gtest_filter='GpuTiledF16Formats.*:Models/GpuVsCpu.*Q4_K*:Models/GpuVsCpu.*Q5_K*:Models/GpuVsCpu.*Q8_0*:Models/GpuVsCpu.*IQ4_*'
grep -h "gpu_tiled_kquant\|gpu_vs_cpu" "$L/gpu_vs_cpu_test.log" 2>/dev/null | head -8
[ -x "$BIN/tiled_formats_cuda_test" ] &&
  timeout 200 "$BIN/tiled_formats_cuda_test" --gtest_also_run_disabled_tests \
    --gtest_filter='TiledFormatsTiming.*' 2>&1 | grep -E "^(Q[458]_[K0]|IQ4_)"
wait
for T in $TYPES; do
  for round in $(seq 1 "${ROUNDS:-2}"); do
    for f in off on; do
      echo "== round $round $T --tiled-f16-formats $f"
      timeout 200 "$BIN/deltaserve" bench --model "/tmp/m_$T.gguf" --prefill 512 --decode 16 \
        --depth 0 --conc ${CONC:-1,16,64} --conc-gen 32 --no-profile --tiled-f16-formats $f 2>&1 |
        grep -E "aggregate decode|decode tg|prefill pp|rror" | sort -u
    done
  done
done
exit $rc
