#!/usr/bin/env bash
# Installs every Debian package deltaserve needs to build and test (Debian 12).
# Idempotent: re-running only installs what is missing. CUDA (nvcc) is optional and is
# taken from /usr/local/cuda when present; it is not installed here.
set -euo pipefail
PKGS=(
  build-essential cmake ninja-build pkg-config git ccache
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  prometheus-cpp-dev libsystemd-dev nlohmann-json3-dev libcpp-httplib-dev libgloo-dev
  libpcre2-dev libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev
  python3
  # chat template reference rendering (tests/tokenizer/render_chat_template.py)
  python3-jinja2
  # operations tests: Prometheus + promtool (tests/ops/prometheus_test.sh), systemd-analyze
  # (unit verification), openssl (TLS test certificates), curl (scrapes)
  prometheus systemd openssl curl
  # multi-host TP test: network namespaces + veth (tests/cluster/netns_tp_test.sh; skips unless root)
  iproute2
)
# Node.js (with npm) is needed for the tokenizer cross-check; some images ship it from another
# Debian-format source, so only ask apt for it when no npm is on PATH.
command -v npm >/dev/null 2>&1 || PKGS+=(nodejs npm)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "setup: all packages present"
