#!/usr/bin/env bash
# GPU half of docs/quality.md. From the carried f32 dump it writes every weight type with
# `ds_quality gguf-from-dump` (the same code as `deltaserve gguf-from-dump`; the checksums it prints
# must equal those of `tools/train/make_demo.sh export` here), then measures the CUDA backend's
# held-out perplexity of each: the prefill path over the whole held-out text, the decode path
# (SeqStep::decode_path) over its first DECODE_TOKENS tokens next to the prefill path over the same
# tokens. (The CPU backend's figures are measured on the CPU machine, docs/quality.md.)
# Usage (device, repo root): OUT=... DS_CARRY=.devcarry-h1 bash tools/train/device_quality.sh Q_DIR
#   Q_DIR: dump.tar.xz (build/demo-dump), vocab.gguf, heldout.txt
set -euo pipefail
cd "$(dirname "$0")/../.."
Q=${1:?folder with dump.tar.xz, vocab.gguf and heldout.txt}
: "${OUT:?set OUT}"
source tools/device/env.sh
W=$(mktemp -d)
tar -C "$W" -xJf "$Q/dump.tar.xz"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
for t in F32 F16 Q8_0 Q6_K Q5_K Q4_K IQ4_XS IQ4_NL; do
  lc=$(echo "$t" | tr 'A-Z' 'a-z')
  "$BIN/ds_quality" gguf-from-dump --dump "$W/demo-dump" --vocab "$Q/vocab.gguf" --type "$t" \
    --out "$W/demo-$lc.gguf" 2>/dev/null
  (cd "$W" && sha256sum "demo-$lc.gguf") | tee -a "$OUT/sha256.txt"
  "$BIN/ds_quality" perplexity --model "$W/demo-$lc.gguf" --text "$Q/heldout.txt" --ctx 512 \
    --backend cuda --json --quiet | tee -a "$OUT/cuda_ppl.jsonl"
done
for t in f32 f16 q8_0 q6_k q5_k q4_k iq4_xs iq4_nl; do
  "$BIN/ds_quality" perplexity --model "$W/demo-$t.gguf" --text "$Q/heldout.txt" --ctx 512 \
    --max-tokens "${DECODE_TOKENS:-8192}" --backend cuda --decode-path --json --quiet | tee -a "$OUT/cuda_decode_ppl.jsonl"
  "$BIN/ds_quality" perplexity --model "$W/demo-$t.gguf" --text "$Q/heldout.txt" --ctx 512 \
    --max-tokens "${DECODE_TOKENS:-8192}" --backend cuda --json --quiet | tee -a "$OUT/cuda_prefill_short_ppl.jsonl"
done
