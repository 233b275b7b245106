#!/usr/bin/env bash
# Installs every Debian package deltaserve needs to build and test (Debian 12).
# Idempotent: re-running only installs what is missing. CUDA (nvcc) is optional and is
# taken from /usr/local/cuda when present; it is not installed here. The CUDA 11.8 toolkit of the
# sm_70 compile check is unpacked under /opt/deltaserve (below).
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

# The sm_70 (V100) compile check of tools/test.sh (issue #19): CUDA 13 cannot target sm_70, so the
# check uses Debian 12's CUDA 11.8 (nvcc 11.8, host compiler g++-11, C++17 device code) from the
# non-free component. The component is used only here, through a private apt source list and
# package index (the system's apt configuration is not touched), and the packages are unpacked
# into DS_CUDA118 instead of being installed: installing nvidia-cuda-toolkit would also install
# the driver libraries (libcuda1, libnvidia-ml1), which change what CUDA and NVML programs find on
# a machine without a GPU, and /usr/bin/nvcc. The main build stays on /usr/local/cuda (CUDA 13).
# Skipped with DS_SKIP_CUDA=1 or DS_SKIP_SM70=1. ~870 MB download, ~3 GB unpacked, ~2-3 min.
DS_CUDA118=${DS_CUDA118:-/opt/deltaserve/cuda-11.8}
if [ "${DS_SKIP_CUDA:-0}" != 1 ] && [ "${DS_SKIP_SM70:-0}" != 1 ] && [ ! -f "$DS_CUDA118/.complete" ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  dpkg-query -W -f='${Status}' g++-11 2>/dev/null | grep -q "install ok installed" ||
    { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends g++-11; }
  apt_dir=$(mktemp -d)
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/debs"
  # bookworm's non-free component (deb.debian.org: the machine's own mirror may lack it).
  echo "deb http://deb.debian.org/debian bookworm non-free" >"$apt_dir/sources.list"
  APT_OPTS=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
            -o "Dir::State::Lists=$apt_dir/lists" -o APT::Sandbox::User=root -qq)
  apt-get "${APT_OPTS[@]}" update
  # nvcc + cicc + libdevice, the headers and libraries (cudart, cuBLAS), nvvm, the cudart runtime.
  (cd "$apt_dir/debs" && apt-get "${APT_OPTS[@]}" download nvidia-cuda-toolkit nvidia-cuda-dev \
    libnvvm4 libcudart11.0)
  $SUDO rm -rf "$DS_CUDA118" && $SUDO mkdir -p "$DS_CUDA118"
  for deb in "$apt_dir"/debs/*.deb; do $SUDO dpkg-deb -x "$deb" "$DS_CUDA118"; done
  rm -rf "$apt_dir"
  # Debian's nvcc.profile is a link to /etc/nvcc.profile with absolute /usr paths; this one finds
  # cicc, ptxas, fatbinary, libdevice (by a path ending in nvvm/libdevice, which CMake's CUDA
  # detection requires), the headers and the libraries relative to the unpacked nvcc.
  bin="$DS_CUDA118/usr/lib/nvidia-cuda-toolkit/bin"
  $SUDO rm -f "$bin/nvcc.profile"
  $SUDO tee "$bin/nvcc.profile" >/dev/null <<'PROFILE'
NVVMIR_LIBRARY_DIR = $(_HERE_)/../../cuda/nvvm/libdevice
PATH		+= $(_HERE_):$(_HERE_)/../../../bin:
INCLUDES	+= "-I$(_HERE_)/../../../include" $(_SPACE_)
LIBRARIES	=+ $(_SPACE_) "-L$(_HERE_)/../../../lib/x86_64-linux-gnu/stubs" "-L$(_HERE_)/../../../lib/x86_64-linux-gnu"
PROFILE
  "$bin/nvcc" --version | tail -2
  $SUDO touch "$DS_CUDA118/.complete"
fi
