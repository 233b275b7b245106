#!/usr/bin/env bash
# Same-call A/B of a host-code change (worker/, the runner, the speculator: deltaserve itself):
# B is the carried build ($DS_CARRY, packed by pack.sh), A only another build's deltaserve
# binary ($A_DIR/deltaserve.xz, ~1.4 MB), run with B's libraries, or with A's kernel library
# too when $A_DIR has libds_kernels_cuda.so.xz (a change on both sides of that library; ~17 MB:
# with B's carry that seldom fits one call, so then a first call keeps B's unpacked carry on
# the machine, KEEP=/tmp/Bc ROUNDS=0, and a second carries only A_DIR and passes B_KEPT=/tmp/Bc).
# Alternated ROUNDS times: the demo's `generate --mtp off|$K` (env.sh's demo settings) and
# `bench --model demo --quick --mtp $K`; then B's generate under the kernel timeline when
# B has ds_kernel_timeline (tools/kernel_timeline), its summary in $OUT/tl_B_<mtp>.txt.
# Usage (device, repo root): DS_CARRY=.devcarry-b A_DIR=.devcarry-ha [ROUNDS=3] [K=4]
#   [KEEP=/tmp/Bc | B_KEPT=/tmp/Bc] bash tools/device/ab_host.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh  # KEEP / B_KEPT: the kept carry (env.sh)
L=${OUT:-/tmp/out}/logs
mkdir -p "$L" /tmp/abh
A_LP=$LD_LIBRARY_PATH
if [ -n "${A_DIR:-}" ]; then
  xz -dc "$A_DIR/deltaserve.xz" >/tmp/abh/deltaserve && chmod +x /tmp/abh/deltaserve
  if [ -f "$A_DIR/libds_kernels_cuda.so.xz" ]; then
    xz -dc "$A_DIR/libds_kernels_cuda.so.xz" >/tmp/abh/libds_kernels_cuda.so
    A_LP=/tmp/abh:$LD_LIBRARY_PATH
  fi
fi
K=${K:-4}
gen() {  # gen <binary> <mtp>: one line, tok/s and tokens per verify
  LD_LIBRARY_PATH=$lp "$1" generate --model demo --backend cuda --max-tokens 256 --prompt "The jury said that" \
    --json --mtp "$2" >"$L/g.json" 2>"$L/g.err" || { fail "generate $1 --mtp $2"; tail -2 "$L/g.err"; }
  gen_summary "$L/g.json"
  # One line per run (the text JSON-quoted: it has newlines of its own).
  python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["text"]))' "$L/g.json" >>"$L/texts_$2.txt"
}
for r in $(seq 1 "${ROUNDS:-3}"); do
  for side in A B; do
    [ $side = A ] && [ -z "${A_DIR:-}" ] && continue
    b=$BIN/deltaserve lp=$LD_LIBRARY_PATH
    [ $side = A ] && b=/tmp/abh/deltaserve lp=$A_LP
    for m in off "$K"; do echo "$side round $r --mtp $m: $(gen "$b" "$m")"; done
    echo "$side round $r bench: $(LD_LIBRARY_PATH=$lp "$b" bench --model demo --quick --mtp "$K" --mtp-conc 1 --mtp-depth 64 --no-profile 2>&1 | grep -E "^ +$K +1 " | head -1)"
  done
done
for m in off "$K"; do
  [ -f "$L/texts_$m.txt" ] || continue
  n=$(sort -u "$L/texts_$m.txt" | wc -l)
  [ "$n" = 1 ] && pass "same text in every --mtp $m run" || fail "texts differ at --mtp $m ($n)"
done
n=$(cat "$L"/texts_*.txt 2>/dev/null | sort -u | wc -l)
[ "$n" -le 1 ] && pass "MTP on and off give the same text" || fail "MTP on / off texts differ"
if [ -f "$BIN/libds_kernel_timeline.so" ]; then
  for m in off "$K"; do
    CUDA_INJECTION64_PATH=$(realpath "$BIN/libds_kernel_timeline.so") DS_TIMELINE_OUT=${OUT:-/tmp/out}/tl_B_$m.txt \
      "$BIN/deltaserve" generate --model demo --backend cuda --max-tokens 256 \
      --prompt "The jury said that" --json --mtp "$m" >/dev/null 2>&1
    grep -E "^graph|^    (dev|host)" "${OUT:-/tmp/out}/tl_B_$m.txt" | head -12
  done
fi
exit $rc
