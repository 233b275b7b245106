# Sourced by the device scripts (run from the repository root on the GPU machine): unpacks the
# archive `DS_PACK_XZ=1 tools/device/pack.sh` left in the carry folder (DS_CARRY, default
# .devcarry; DS_PACK_OUT when packing) when that was not done yet, points the loader at the carried
# shared libraries and the image's CUDA toolkit, keeps NCCL off NVLink multicast (the device
# machine's rule), sets BIN (default $DS_CARRY/bin) and the PASS/FAIL helpers.
# Two carries seldom fit one call: KEEP=dir copies this call's unpacked carry to dir on the
# machine, and a later call on the same warm machine passes B_KEPT=dir to run from that copy
# (its binaries and libraries) while it carries something else (ab_two_carries.sh, ab_host.sh).
DS_CARRY=${DS_CARRY:-.devcarry}
if [ -n "${B_KEPT:-}" ]; then
  BIN=$B_KEPT/bin
  export LD_LIBRARY_PATH="$B_KEPT/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
else
  if [ -z "${BIN:-}" ] && [ -f "$DS_CARRY/dc.tar.xz" ] && [ ! -d "$DS_CARRY/bin" ]; then
    _x=$(mktemp -d) && tar -C "$_x" -xJf "$DS_CARRY/dc.tar.xz" && rm -rf "$DS_CARRY" && mv "$_x/dc" "$DS_CARRY"
  fi
  export LD_LIBRARY_PATH="$PWD/$DS_CARRY/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  [ -n "${KEEP:-}" ] && rm -rf "$KEEP" && cp -r "$PWD/$DS_CARRY" "$KEEP"
fi
export NCCL_NVLS_ENABLE=0
BIN=${BIN:-$DS_CARRY/bin}
# The check scripts' result lines: one PASS/FAIL line per check, any FAIL makes `exit $rc` fail.
rc=0
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; rc=1; }
# Waits up to $3 seconds (default 150) for the gateway at $1 to report SERVING while process $2
# lives; sets i to the seconds it took. Returns 1 when it did not.
wait_serving() {
  local addr=$1 pid=$2 limit=${3:-150}
  for i in $(seq 1 "$limit"); do
    "$BIN/deltactl" health --addr "$addr" 2>/dev/null | grep -q "^SERVING" && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 1
  done
  return 1
}
# The 27B-shape Q6_K synth file (~40 s) at path $1 unless it is there already (it is never
# carried; $2: the weight type, Q6_K when absent); scripts run it beside their tests as
# `synth_27b "$M" &` and `wait` before the bench.
synth_27b() {
  [ -s "$1" ] || timeout 200 "$BIN/deltaserve" gguf-synth --preset 27b --type "${2:-Q6_K}" --out "$1" >/dev/null 2>&1
}
# One line from a `deltaserve generate --json` output file $1: tok/s, tokens, and with MTP the
# tokens per verify and the acceptance by position.
gen_summary() {
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); m=d.get("mtp") or {}; print("gen tok/s %.1f tokens %d tokens/verify %s acceptance %s" % (d["generation_tokens_per_second"], d["generated_tokens"], m.get("mean_accepted_length"), m.get("acceptance")))' "$1" 2>&1 | tail -1
}
# `deltaserve generate` on the demo model (256 tokens, "The jury said that", greedy unless GEN_ARGS
# sets sampling with one --seed), $1 rounds of each run given after it (the flags after --mtp:
# "off", "4 --fused-draft off", ...), outputs in $L/gen_<run>_<round>.json, one summary line and
# a PASS/FAIL line each; then whether every output's text is the same (it does not depend on MTP
# or its kernels).
demo_generate_rounds() {
  local rounds=$1 rep run tag r
  shift
  for rep in $(seq 1 "$rounds"); do
    for run in "$@"; do
      tag=${run// /_}
      timeout 60 "$BIN/deltaserve" generate --model demo --backend cuda --max-tokens 256 \
        --prompt "The jury said that" --json --mtp $run ${GEN_ARGS:-} >"$L/gen_${tag}_$rep.json" \
        2>"$L/gen_${tag}_$rep.err"
      r=$?
      echo "generate --mtp $run (run $rep): rc=$r $(gen_summary "$L/gen_${tag}_$rep.json")"
      [ $r = 0 ] && pass "generate mtp $run" || { fail "generate mtp $run"; tail -3 "$L/gen_${tag}_$rep.err"; }
    done
  done
  python3 - "$L" <<'PY'
import json, sys, glob
texts = {}
for f in sorted(glob.glob(sys.argv[1] + "/gen_*.json")):
    try: texts[f] = json.load(open(f)).get("text")
    except Exception as e: texts[f] = "unreadable: %s" % e
print("texts identical across runs:", len(set(texts.values())) == 1, "(%d runs)" % len(texts))
PY
}
# Runs the packed gtest binary $1 (its arguments after it) under a 240 s limit, its log in
# $L/$1.log (L: the calling script's log folder); prints the summary and the failures, then a
# PASS/FAIL line. A binary that was not packed is skipped.
run_gtest() {
  local b=$1 t0=$SECONDS r
  shift
  [ -x "$BIN/$b" ] || { echo "skip $b (not packed)"; return 0; }
  timeout 240 "$BIN/$b" "$@" --gtest_color=no >"$L/$b.log" 2>&1
  r=$?
  echo "$b: rc=$r in $((SECONDS - t0)) s; $(grep -E '^\[  (PASSED|FAILED)' "$L/$b.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]|Failure|Expected|Which is|drafts kept" "$L/$b.log" | head -20
  [ $r = 0 ] && pass "$b" || fail "$b"
}
# The same-call A/B scripts' start (ab_bench.sh, demo_gen_ab.sh): the log folder L, the packed
# gtest binaries of $TESTS, and binary A (the xz-packed build $A_XZ, using B's shared libraries).
ab_setup() {
  L=${OUT:-/tmp/out}/logs
  mkdir -p "$L"
  for t in ${TESTS:-}; do run_gtest "$t"; done
  A=/tmp/ab_a/deltaserve
  mkdir -p /tmp/ab_a && xz -dc "${A_XZ:?}" > "$A" && chmod +x "$A"
  # Binary A runs with B's shared libraries: a build whose kernels are a shared library (pack.sh's
  # default since 2026-12-06) would run B's kernels, so A must come from a static build
  # (DS_PACK_SHARED=OFF), or the A/B measures B twice.
  if ldd "$A" | grep -q libds_kernels_cuda; then
    fail "ab_setup: binary A loads libds_kernels_cuda.so (B's); build A with DS_PACK_SHARED=OFF"
    exit 1
  fi
}
