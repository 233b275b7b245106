#!/usr/bin/env bash
# Kernel timelines of graph replays (tools/kernel_timeline/README.md): where a decode step, an MTP
# verify and a draft chain spend their time on the device, kernel by kernel, inside the graphs
# (ncu times kernels alone; nsys is not on the device machine). Each traced run writes its
# summary to $OUT/tl_<name>.txt; the same run untraced first shows what tracing costs.
# Here: DS_PACK_XZ=1 DS_PACK_BUILD=build-dev DS_PACK_OUT=.devcarry-t bash tools/device/pack.sh
# deltaserve ds_kernel_timeline; on the device: DS_CARRY=.devcarry-t bash tools/device/timeline.sh
# (BIG=0: the demo model only; MTP_K: drafts, default 4).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
# The commands' outputs stay on the machine (/tmp/tl_logs); only the summaries come back in
# $OUT (a call returns a few files: with every log there the summaries were left out).
L=/tmp/tl_logs
S=${OUT:-/tmp/out}
mkdir -p "$L" "$S"
TL=$(realpath "$BIN/libds_kernel_timeline.so")
K=${MTP_K:-4}
M=${MODEL:-/tmp/m.gguf}
[ "${BIG:-1}" = 1 ] && { synth_27b "$M" & }
# traced <name> <command...>: the command with the timeline library injected, its output in
# $L/<name>.out, the summary in $S/tl_<name>.txt; prints the summary's graph lines.
traced() {
  local name=$1
  shift
  CUDA_INJECTION64_PATH=$TL DS_TIMELINE_OUT=$S/tl_$name.txt DS_TIMELINE_NODES=${NODES:-1} "$@" \
    >"$L/$name.out" 2>&1
  echo "== $name traced: $(head -1 "$S/tl_$name.txt" 2>/dev/null)"
  grep -E "^graph " "$S/tl_$name.txt" | head -12
}
demo_bench=("$BIN/deltaserve" bench --model demo --quick --mtp "$K" --mtp-conc 1 --mtp-depth 64 --no-profile)
gen=("$BIN/deltaserve" generate --model demo --backend cuda --max-tokens 256 --prompt "The jury said that" --json)
echo "== demo bench --mtp $K, untraced then traced"
"${demo_bench[@]}" 2>&1 | tail -2
traced demo_bench "${demo_bench[@]}"
tail -2 "$L/demo_bench.out"
for m in off "$K"; do
  "${gen[@]}" --mtp "$m" >"$L/gen_$m.json" 2>/dev/null
  echo "generate --mtp $m untraced: $(gen_summary "$L/gen_$m.json")"
  traced "gen_$m" "${gen[@]}" --mtp "$m"
  grep -v "^cuda backend\|^kernel timeline" "$L/gen_$m.out" >"$L/gen_${m}_t.json"
  echo "generate --mtp $m traced: $(gen_summary "$L/gen_${m}_t.json")"
done
if [ "${BIG:-1}" = 1 ]; then
  wait
  big=("$BIN/deltaserve" bench --model "$M" --prefill 512 --decode 32 --depth 0 --conc ${BIG_CONC:-1,16,64} --conc-gen 32 --no-profile)
  echo "== 27B bench, untraced then traced"
  "${big[@]}" 2>&1 | grep -E "^(decode tg|aggregate)" | sort -u
  traced big "${big[@]}"
  grep -E "^(decode tg|aggregate)" "$L/big.out" | sort -u
fi
exit $rc
