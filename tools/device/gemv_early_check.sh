#!/usr/bin/env bash
# The float GEMV's early weights (GemvArgs::early_weights, CudaBackendOptions::gemv_early_weights;
# issue #22): the 27B's ssm_alpha / ssm_beta pair per launch warm and with a cold L2
# (GemvTiming.DISABLED_SmallF32Pair27B), then the 27B Q6_K synth's decode with the defaults and
# with `--gemv-early-weights off`, alternated $ROUNDS times (default 2).
# Here: pack.sh deltaserve kernels_cuda_test; on the device:
#   DS_CARRY=... [ROUNDS=2] [CONC=1,16,64] bash tools/device/gemv_early_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
M=${MODEL:-/tmp/m.gguf}
synth_27b "$M" &
timeout 120 "$BIN/kernels_cuda_test" --gtest_also_run_disabled_tests \
  --gtest_filter='GemvTiming.DISABLED_SmallF32Pair27B' >"$L/gemv_timing.log" 2>&1
grep -vE "^\[|^$|^Note" "$L/gemv_timing.log" | head -20
wait
for r in $(seq 1 "${ROUNDS:-2}"); do
  for cfg in "" "--gemv-early-weights off"; do
    timeout 200 "$BIN/deltaserve" bench --model "$M" --prefill 512 --decode 32 --depth 0 \
      --conc "${CONC:-1,16,64}" --conc-gen 32 --no-profile $cfg >"$L/b.out" 2>&1 || fail "bench $cfg"
    echo "round $r [${cfg:-defaults}]: $(grep -E "^(decode tg|aggregate)" "$L/b.out" | sort -u | tr -s ' ' | tr '\n' '|')"
  done
done
exit $rc
