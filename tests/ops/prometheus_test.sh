#!/usr/bin/env bash
# CI entry of the end-to-end Prometheus test (see prometheus_test.py). Installs nothing: needs
# Debian's prometheus (tools/setup.sh). Usage: prometheus_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
BUILD=${1:?usage: prometheus_test.sh BUILD_DIR SOURCE_DIR}
SRC=${2:?usage: prometheus_test.sh BUILD_DIR SOURCE_DIR}
exec python3 "$SRC/tests/ops/prometheus_test.py" --deltaserve "$BUILD/tools/deltaserve" \
  --deltactl "$BUILD/tools/deltactl/deltactl" --src "$SRC" \
  --fake-nvml-dir "$BUILD/tests/ops/fake_nvml" "${@:3}"
