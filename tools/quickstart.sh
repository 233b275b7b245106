#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds deltaserve and runs the main job on the embedded
# default: the demo model the project trained (models/demo/demo-f16.gguf, `--model demo`; a 7M
# parameter qwen35 with MTP, Brown Corpus English), served by the whole cluster (gateway ->
# scheduler -> worker, as local processes) with a streamed continuation and a chat answer through
# the public gRPC API.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target deltaserve deltactl
(cd models/demo && sha256sum -c --quiet demo-f16.gguf.sha256)
exec ./build/tools/deltaserve serve --model demo --backend auto --demo-max-tokens 64 \
  --demo "The old man looked at the sea and" --demo-chat "Tell me about the house by the river."
