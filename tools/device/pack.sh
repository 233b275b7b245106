#!/usr/bin/env bash
# Builds the CUDA binaries here (sm_90a) and packs them with the shared libraries they need
# (everything `ldd` lists except glibc, the driver's libcuda and the CUDA toolkit's own libraries,
# which the device image has) into .devcarry/, which the device tool carries to the GPU machine. Usage: tools/device/pack.sh [target ...]
set -euo pipefail
cd "$(dirname "$0")/../.."
TARGETS=${*:-deltaserve kernels_cuda_test}
BUILD=${DS_PACK_BUILD:-build-dev}
OUT=${DS_PACK_OUT:-.devcarry}
# The kernels as one shared library (DS_CUDA_KERNELS_SHARED): packed once, not once per binary,
# so deltaserve and every GPU test binary fit one archive (~28 MB, 2026-12-06) and one call.
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDS_CUDA_ARCHS=90a \
  -DDS_CUDA_KERNELS_SHARED="${DS_PACK_SHARED:-ON}" \
  -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache >/dev/null
cmake --build "$BUILD" -j"${DS_JOBS:-2}" --target $TARGETS
rm -rf "$OUT" && mkdir -p "$OUT/bin" "$OUT/lib"
for t in $TARGETS; do
  # An executable, or a shared library target (lib<target>.so, e.g. ds_kernel_timeline).
  f=$(find "$BUILD" -type f \( -name "$t" -o -name "lib$t.so" \) -perm -u+x | head -1)
  [ -n "$f" ] || { echo "pack: target $t not built" >&2; exit 1; }
  cp "$f" "$OUT/bin/"
  ldd "$f" | awk '/=> \//{print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      # glibc and the driver are the machine's; the CUDA toolkit libraries (cudart, cublas,
      # cublasLt: ~700 MB) are on the device image under /usr/local/cuda/lib64.
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*) ;;
      libcudart.so*|libcublas.so*|libcublasLt.so*|libnccl.so*) ;;
      *) cp -Ln "$lib" "$OUT/lib/" ;;
    esac
  done
done
# The device call carries at most 64 MiB with the sources; the cluster's shared libraries put
# .devcarry at ~60 MB (2026-11-29). DS_PACK_XZ=1 leaves one xz archive (~15 MB) instead; unpack
# it first on the device: mkdir -p /tmp/x && tar -C /tmp/x -xJf .devcarry/dc.tar.xz &&
# rm -rf .devcarry && mv /tmp/x/dc .devcarry
if [ "${DS_PACK_XZ:-0}" = 1 ]; then
  tmp=$(mktemp -d) && mv "$OUT" "$tmp/dc" && mkdir "$OUT"
  tar -C "$tmp" -cf - dc | xz -T"${DS_JOBS:-2}" -6 > "$OUT/dc.tar.xz"
  rm -rf "$tmp"
fi
du -sh "$OUT"
