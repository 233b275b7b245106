#!/usr/bin/env bash
# Device half of the demo-model pipeline (tools/train/README.md): trains tools/train/train.py on
# the token ids that `make_demo.sh data` prepared (carried to the GPU machine) and leaves the f32
# dump, the training log and the PyTorch reference outputs in $OUT.
# Usage (on the device, from the repo root): OUT=... bash tools/train/device_train.sh DATA_DIR
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${1:?data folder (train.u16, heldout.u16, prompts.json, vocab.json)}
: "${OUT:?set OUT to the output folder}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
PYTHONUNBUFFERED=1 python3 tools/train/train.py --data "$DATA" --out "$OUT" --minutes "${MINUTES:-3.5}"
ls -la "$OUT"
