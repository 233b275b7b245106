#!/usr/bin/env bash
# Sampled requests with MTP on the device (issue #15): the sampler's uniforms are keyed by position
# and a verify keeps a draft iff it equals the row's own sample (worker/spec/speculative_rule.h),
# so sampled tokens with MTP equal plain sampling's per seed, and sampled sequences without
# penalties take the device path (rows sampled where the logits are, drafts chained there).
#   1. mtp_gpu_test (SampledWithDraftsEqualsPlainSamplingPerSeed and the rest), sampling_cuda_test;
#   2. `generate` sampled (T 0.8, top-k 40, seed 5) with --mtp off and 3, on the demo model (256
#      tokens) and on the synthetic 27B Q6_K file (128 tokens, random weights: drafts rejected):
#      token ids must be equal; tok/s and acceptance printed; then greedy on the demo for scale.
# Usage (device, repo root, after
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h3 DS_PACK_OUT=.devcarry-lead bash tools/device/pack.sh \
#     deltaserve mtp_gpu_test sampling_cuda_test):
#   DS_CARRY=.devcarry-lead bash tools/device/mtp_sampled_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
L=${OUT:-/tmp}/mtp_sampled; mkdir -p "$L"
MODEL=${MODEL:-/tmp/m.gguf}
( [ -s "$MODEL" ] || "$BIN/deltaserve" gguf-synth --preset 27b --type Q6_K --out "$MODEL" \
    >"$L/synth.log" 2>&1 ) &
SYNTH=$!
for t in mtp_gpu_test sampling_cuda_test; do run_gtest "$t"; done
gen() {  # gen MODEL TAG MTP MAX_TOKENS EXTRA...
  local m=$1 tag=$2 k=$3 n=$4; shift 4
  timeout 200 "$BIN/deltaserve" generate --model "$m" --backend cuda --max-tokens "$n" \
    --prompt "The jury said that the city had" --ignore-eos --json --mtp "$k" "$@" \
    >"$L/$tag.json" 2>"$L/$tag.err" || { fail "$tag: generate failed"; tail -3 "$L/$tag.err"; }
  python3 -c "
import json, sys
j = json.load(open('$L/$tag.json'))
m = j.get('mtp', {})
print('$tag: %.1f tok/s, %d tokens' % (j['generation_tokens_per_second'], j['generated_tokens']),
      ('tokens/verify %.2f acceptance %s' % (m['mean_accepted_length'],
       ' '.join('%.3f' % a for a in m['acceptance']))) if m else '')
" 2>&1
}
same() {  # same TAG_A TAG_B
  python3 -c "
import json
a = json.load(open('$L/$1.json'))['tokens']; b = json.load(open('$L/$2.json'))['tokens']
n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
print('$1 vs $2: %d / %d tokens equal before the first difference' % (n, len(a)))
exit(0 if a == b else 1)" && pass "$2 tokens equal $1" || fail "$2 tokens differ from $1"
}
S="--temperature 0.8 --top-k 40 --seed 5"
for run in 1 2; do
  gen demo demo_off_$run off 256 $S
  gen demo demo_mtp3_$run 3 256 $S
  same demo_off_$run demo_mtp3_$run
done
gen demo demo_greedy_off off 256
gen demo demo_greedy_mtp3 3 256
same demo_greedy_off demo_greedy_mtp3
wait $SYNTH
gen "$MODEL" 27b_off off 128 $S
gen "$MODEL" 27b_mtp3 3 128 $S
same 27b_off 27b_mtp3
exit $rc
