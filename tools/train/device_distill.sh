#!/usr/bin/env bash
# Device half of the demo model's MTP self-distillation (tools/train/distill_mtp.py): retrains the
# MTP block of models/demo/demo-f16.gguf against the frozen trunk, exports the result as F16 with
# the carried deltaserve binary, then measures old and new file on the GPU: `mtp-accept` on the
# held-out text (acceptance by draft position), and `generate --mtp off|3|4` on several prompts,
# alternating the two files. Leaves demo-f16.gguf, pytorch_ref.json, distill_log.txt and the
# measurement log in $OUT/distill.
# Usage (device, repo root), after here
#   DS_PACK_XZ=1 DS_PACK_BUILD=build-h3 DS_PACK_OUT=.devcarry-lead bash tools/device/pack.sh deltaserve
#   and `bash tools/train/make_demo.sh distill-data` (the token ids in DATA, default
#   .devcarry-distill; carry both folders):
#   DS_CARRY=.devcarry-lead [MINUTES=2.5] [DISTILL_ARGS="--chain 4"] bash tools/train/device_distill.sh
# The committed file came from MINUTES=2.5 DISTILL_ARGS="--chain 4" (models/demo/README.md).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/env.sh
DATA=${DATA:-.devcarry-distill}
O=${OUT:-/tmp/out}/distill
mkdir -p "$O" /tmp/dump
PYTHONUNBUFFERED=1 python3 tools/train/distill_mtp.py --data "$DATA" --model models/demo/demo-f16.gguf \
  --ref tests/model/data/demo_pytorch_ref.json --out /tmp/dump --minutes "${MINUTES:-2}" ${DISTILL_ARGS:-} || exit 1
cp /tmp/dump/distill_log.txt /tmp/dump/pytorch_ref.json "$O/"
"$BIN/deltaserve" gguf-from-dump --dump /tmp/dump --vocab models/demo/demo-f16.gguf --type F16 \
  --out "$O/demo-f16.gguf" || exit 1
NEW=$O/demo-f16.gguf OLD=models/demo/demo-f16.gguf
{
  for f in "$OLD" "$NEW"; do
    echo "== mtp-accept $f"
    timeout 120 "$BIN/deltaserve" mtp-accept --model "$f" --text "$DATA/heldout.txt" --draft 4 2>&1 | tail -8
  done
  for prompt in "The jury said that" "It was a cold morning, and" "In the spring of that year" \
                "The committee will meet"; do
    for rep in 1 2; do
      for f in "$OLD" "$NEW"; do
        for k in off 3 4; do
          timeout 60 "$BIN/deltaserve" generate --model "$f" --backend cuda --max-tokens 256 \
            --prompt "$prompt" --json --mtp $k >/tmp/g.json 2>/tmp/g.err || tail -3 /tmp/g.err
          echo "$(basename "$(dirname "$f")")/$(basename "$f") | $prompt | mtp $k | run $rep | $(gen_summary /tmp/g.json)"
        done
      done
    done
  done
} 2>&1 | tee "$O/measure.log"
