#!/usr/bin/env bash
# The verify's GDN run forms (issue #15): each token's prologue and epilogue in thread group
# c % groups (CudaBackendOptions::gdn_spread_run_tokens) and one thread group per head at dk = 64
# (gdn_one_group_runs, off until measured), and the fused chain's S2 fold and weight prefetch
# (--chain-fold, --chain-prefetch; off until measured). The kernel tests that check the forms bit for bit
# (spec_kernels_cuda_test, gdn_launch_cuda_test), mtp_gpu_test and batch_invariance_test, then the
# demo's k = 4 verify step and chain cycle with each bench flag set of CFGS (";"-separated, "-" =
# the defaults) alternated ROUNDS times (one binary), then `generate` with MTP off and at k = 4
# (and KS) over 256 and 1,024 tokens with each flag set of GEN_CFGS (the same form; default: the
# defaults only).
# Here: DS_PACK_XZ=1 DS_PACK_BUILD=build-dev DS_PACK_OUT=.devcarry-jc bash tools/device/pack.sh \
#   deltaserve ds_kernel_timeline mtp_gpu_test spec_kernels_cuda_test gdn_launch_cuda_test \
#   batch_invariance_test
# On the device: DS_CARRY=.devcarry-jc [ROUNDS=2] [CFGS="-;--gdn-one-group on;--gdn-spread off;
#   --chain-fold on;--chain-prefetch on"] [GEN_CFGS="-;--gdn-one-group on"] [KS="4"]
#   [TESTS="..."] [GTEST_FILTER=...] bash tools/device/gdn_spread_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp/out}/logs
mkdir -p "$L"
for t in ${TESTS-spec_kernels_cuda_test gdn_launch_cuda_test mtp_gpu_test batch_invariance_test}; do
  run_gtest "$t"
done
IFS=';' read -ra cfgs <<<"${CFGS:--;--gdn-one-group on;--gdn-spread off;--chain-fold on;--chain-prefetch on}"
for r in $(seq 1 "${ROUNDS:-2}"); do
  for cfg in "${cfgs[@]}"; do
    [ "$cfg" = "-" ] && cfg=""
    timeout 120 "$BIN/deltaserve" bench --model demo --quick --mtp 4 --mtp-conc 1 --mtp-depth 64 \
      --no-profile $cfg >"$L/b.out" 2>&1 || fail "bench $cfg"
    echo "round $r [${cfg:-defaults}]: $(grep -E "^ +4 +1 " "$L/b.out" | head -1 | tr -s ' ')"
  done
done
grep -B1 -E "^ +k +streams" "$L/b.out" | head -2
gen=("$BIN/deltaserve" generate --model demo --backend cuda --prompt "The jury said that" --json)
IFS=';' read -ra gcfgs <<<"${GEN_CFGS:--}"
for r in $(seq 1 "${ROUNDS:-2}"); do
  for gcfg in "${gcfgs[@]}"; do
    [ "$gcfg" = "-" ] && gcfg=""
    for m in off ${KS:-4}; do
      for n in 256 1024; do
        timeout 60 "${gen[@]}" --mtp $m --max-tokens $n $gcfg >"$L/g.json" 2>"$L/g.err" ||
          fail "generate --mtp $m --max-tokens $n $gcfg"
        echo "round $r [${gcfg:-defaults}] --mtp $m --max-tokens $n: $(gen_summary "$L/g.json")"
      done
    done
  done
done
exit $rc
