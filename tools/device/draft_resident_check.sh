#!/usr/bin/env bash
# The fused draft chain's resident form (kernels/cuda/mtp_chain.cuh, MtpChainArgs::resident; issue
# #15's demo row): the tests, then the trained demo model end to end (`generate --mtp off | 4`,
# the global form by default, `--draft-resident on` for the resident one, `--fused-draft off` for
# the per-kernel chain) and the chain cycle in the bench with both forms, alternated.
#   1. TESTS (default: mtp_gpu_test batch_invariance_test gpu_vs_cpu_test gdn_launch_cuda_test),
#      each with GTEST_ARGS (e.g. --gtest_filter='FusedDraft*' for a short call);
#   2. `deltaserve generate --model demo --backend cuda --max-tokens 256 --mtp off|4
#      [--draft-resident on | --fused-draft off]`, ROUNDS rounds;
#   3. `deltaserve bench --model demo --quick --mtp BENCH_K (3,4) --mtp-conc 1 --mtp-depth 64 --no-profile
#      --draft-resident off|on`, ROUNDS rounds.
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-dev DS_PACK_OUT=.devcarry-next bash tools/device/pack.sh
#   deltaserve mtp_gpu_test batch_invariance_test gpu_vs_cpu_test gdn_launch_cuda_test):
#   DS_CARRY=.devcarry-next bash tools/device/draft_resident_check.sh
# The short form (~2 minutes): TESTS=mtp_gpu_test GTEST_ARGS="--gtest_filter=FusedDraft*" ROUNDS=1
# BENCH_K=4 DS_CARRY=.devcarry-next bash tools/device/draft_resident_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
O=${OUT:-/tmp/out}
L=$O/logs
mkdir -p "$L"
for t in ${TESTS-mtp_gpu_test batch_invariance_test gpu_vs_cpu_test gdn_launch_cuda_test}; do
  run_gtest "$t" ${GTEST_ARGS:-}
done
demo_generate_rounds "${ROUNDS:-2}" "off" "4" "4 --draft-resident on" "4 --fused-draft off"
for rep in $(seq 1 "${ROUNDS:-2}"); do
  for fd in "--draft-resident off" "--draft-resident on"; do
    echo "== bench $fd (round $rep)"
    timeout 120 "$BIN/deltaserve" bench --model demo --quick --mtp ${BENCH_K:-3,4} --mtp-conc 1 \
      --mtp-depth 64 --no-profile $fd 2>&1 | tee "$L/bench_${fd// /_}_$rep.log" |
      grep -E "greedy draft chain|decode|^ k streams|^ [0-9] +[0-9]+ " | head -9
  done
done
exit $rc
