#!/usr/bin/env bash
# Builds the libFuzzer targets with clang in build-fuzz/ and fuzzes each for a bounded time,
# starting from a scratch copy of its committed seed corpus (tests/fuzz/corpus/<name>/) and its
# dictionary where there is one (tests/fuzz/<name>.dict). Exits non-zero on any crash, leak,
# sanitizer report, invariant failure, timeout or OOM; the reproducer is left in
# build-fuzz/artifacts/. The GGUF reader gets SECONDS (default 60), the text targets (tokenizer,
# chat output parser, OpenAI request bodies, the json_object automaton) SECONDS / 2 each.
#   usage: tests/fuzz/run_fuzz.sh [SECONDS]
set -euo pipefail
SECONDS_TO_RUN="${1:-60}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$ROOT/build-fuzz"

# Standalone configure of tests/fuzz (needs abseil, nlohmann-json and PCRE2), so fuzzing does not
# depend on the rest of the tree building.
CC=clang CXX=clang++ cmake -S "$ROOT/tests/fuzz" -B "$BUILD" -G Ninja -DDS_FUZZ=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
TARGETS="gguf tokenizer chat_output openai_request json_grammar"
cmake --build "$BUILD" -j2 --target $(for t in $TARGETS; do printf '%s_fuzz ' "$t"; done)

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$BUILD/artifacts"
for t in $TARGETS; do
  secs=$SECONDS_TO_RUN
  [ "$t" = gguf ] || secs=$(( (SECONDS_TO_RUN + 1) / 2 ))
  mkdir -p "$WORK/$t"
  cp "$ROOT/tests/fuzz/corpus/$t"/* "$WORK/$t/"
  dict=()
  [ -f "$ROOT/tests/fuzz/$t.dict" ] && dict=(-dict="$ROOT/tests/fuzz/$t.dict")
  echo "fuzzing $t for ${secs}s (corpus copy in $WORK/$t)"
  # -rss_limit_mb / -malloc_limit_mb turn a runaway allocation (e.g. trusting a huge array count)
  # into a reported crash instead of a slow death.
  "$BUILD/${t}_fuzz" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
    -malloc_limit_mb=1024 -max_len=16384 -print_final_stats=1 "${dict[@]}" \
    -artifact_prefix="$BUILD/artifacts/${t}-" "$WORK/$t"
done
