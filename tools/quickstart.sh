#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds deltaserve and runs the main job on the embedded
# default: a tiny random-weight qwen35 model that the project generates (build/tiny.gguf).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
[ -f build/tiny.gguf ] || ./build/tools/deltaserve gguf-synth --preset tiny --seed 1 --out build/tiny.gguf
if [ -x build/tools/deltaserve ] && ./build/tools/deltaserve 2>&1 | grep -q "^  serve"; then
  exec ./build/tools/deltaserve serve --model build/tiny.gguf --demo "Hello, deltaserve!"
fi
exec ./build/tools/deltaserve generate --model build/tiny.gguf --prompt "Hello, deltaserve!" \
  --max-tokens 48 --temperature 0.8 --seed 7
