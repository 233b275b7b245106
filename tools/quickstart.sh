#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds deltaserve and runs the main job on the embedded
# default: a tiny random-weight qwen35 model that the project generates (build/tiny.gguf), served
# by the whole cluster (gateway -> scheduler -> worker, as local processes) with one streamed
# generation through the public gRPC API.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target deltaserve deltactl
[ -f build/tiny.gguf ] || ./build/tools/deltaserve gguf-synth --preset tiny --seed 1 --out build/tiny.gguf
exec ./build/tools/deltaserve serve --model build/tiny.gguf --backend auto --demo "Hello, deltaserve!"
