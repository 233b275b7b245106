#!/usr/bin/env bash
# Builds the GGUF libFuzzer target with clang in build-fuzz/ and fuzzes for SECONDS (default 60)
# starting from a scratch copy of the committed seed corpus. Exits non-zero on any crash, leak,
# sanitizer report, timeout or OOM; the reproducer is left in build-fuzz/artifacts/.
#   usage: tests/fuzz/run_fuzz.sh [SECONDS]
set -euo pipefail
SECONDS_TO_RUN="${1:-60}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$ROOT/build-fuzz"

# Standalone configure of tests/fuzz (needs only abseil), so fuzzing does not depend on the rest
# of the tree building.
CC=clang CXX=clang++ cmake -S "$ROOT/tests/fuzz" -B "$BUILD" -G Ninja -DDS_FUZZ=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD" -j2 --target gguf_fuzz

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/corpus" "$BUILD/artifacts"
cp "$ROOT"/tests/fuzz/corpus/gguf/* "$WORK/corpus/"

echo "fuzzing gguf for ${SECONDS_TO_RUN}s (corpus copy in $WORK/corpus)"
# -rss_limit_mb / -malloc_limit_mb turn a runaway allocation (e.g. trusting a huge array count)
# into a reported crash instead of a slow death.
"$BUILD/gguf_fuzz" -max_total_time="$SECONDS_TO_RUN" -timeout=10 -rss_limit_mb=2048 \
  -malloc_limit_mb=1024 -max_len=16384 -print_final_stats=1 \
  -artifact_prefix="$BUILD/artifacts/" "$WORK/corpus"
