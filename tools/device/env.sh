# Sourced by the device scripts (run from the repository root on the GPU machine): unpacks the
# archive `DS_PACK_XZ=1 tools/device/pack.sh` left in .devcarry when that was not done yet, points
# the loader at the carried shared libraries and the image's CUDA toolkit, keeps NCCL off NVLink
# multicast (the device machine's rule), sets BIN (default .devcarry/bin) and the PASS/FAIL helpers.
if [ -z "${BIN:-}" ] && [ -f .devcarry/dc.tar.xz ] && [ ! -d .devcarry/bin ]; then
  _x=$(mktemp -d) && tar -C "$_x" -xJf .devcarry/dc.tar.xz && rm -rf .devcarry && mv "$_x/dc" .devcarry
fi
export LD_LIBRARY_PATH="$PWD/.devcarry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0
BIN=${BIN:-.devcarry/bin}
# The check scripts' result lines: one PASS/FAIL line per check, any FAIL makes `exit $rc` fail.
rc=0
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; rc=1; }
