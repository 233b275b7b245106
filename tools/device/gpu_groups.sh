#!/usr/bin/env bash
# The whole GPU test suite in as few device calls as fit: packs the GPU-labelled gtest binaries
# (or the targets given) into carry folders .devcarry-g1, -g2, ... whose archives each fit one call
# (64 MiB with the tracked tree, ~26.5 MB on 2026-12-05, so DS_GROUP_MB=36 MB of archive), then
# prints each call's device command (tools/device/gpu_tests.sh runs whatever binary a carry holds).
# Groups are filled in the order given, by the binaries' raw sizes (xz keeps ~0.35-0.45 of them);
# a group whose archive comes out too large gives its last target to the next one and is packed
# again. Usage (here): bash tools/device/gpu_groups.sh [target ...]
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${DS_PACK_BUILD:-build-dev}
LIMIT_MB=${DS_GROUP_MB:-36}
RAW_MB=${DS_GROUP_RAW_MB:-85}
TARGETS=(${*:-deltaserve kernels_cuda_test tiled_cuda_test gdn_cuda_test kv_quant_cuda_test
  spec_kernels_cuda_test mmq_cuda_test tiled_f16_cuda_test tiled_formats_cuda_test
  draft_head_cuda_test page_copy_cuda_test gdn_launch_cuda_test sampling_cuda_test gpu_vs_cpu_test
  batch_invariance_test mtp_gpu_test checkpoint_gpu_test portable_gpu_test paged_kv_gpu_test
  prefix_cache_gpu_test worker_mtp_tp_gpu_test tp_custom_allreduce_test})
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDS_CUDA_ARCHS=90a \
  -DDS_CUDA_KERNELS_SHARED="${DS_PACK_SHARED:-ON}" \
  -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache >/dev/null
cmake --build "$BUILD" -j"${DS_JOBS:-2}" --target "${TARGETS[@]}" ds_tp_rank
raw_mb() { du -m "$(find "$BUILD" -type f -name "$1" -perm -u+x | head -1)" | cut -f1; }

rm -rf .devcarry-g[0-9]*
group=1
queue=("${TARGETS[@]}")
while [ ${#queue[@]} -gt 0 ]; do
  members=() sum=0
  for t in "${queue[@]}"; do
    mb=$(raw_mb "$t")
    [ ${#members[@]} -gt 0 ] && [ $((sum + mb)) -gt "$RAW_MB" ] && break
    members+=("$t") sum=$((sum + mb))
  done
  while :; do
    out=.devcarry-g$group
    extra=()  # tp_custom_allreduce_test runs its ranks as ds_tp_rank processes
    [[ " ${members[*]} " == *" tp_custom_allreduce_test "* ]] && extra=(ds_tp_rank)
    DS_PACK_XZ=1 DS_PACK_BUILD="$BUILD" DS_PACK_OUT="$out" bash tools/device/pack.sh "${members[@]}" "${extra[@]}" >/dev/null
    size=$(du -m "$out/dc.tar.xz" | cut -f1)
    if [ "$size" -le "$LIMIT_MB" ] || [ ${#members[@]} -eq 1 ]; then break; fi
    unset 'members[-1]'
  done
  [ "$size" -le "$LIMIT_MB" ] || echo "gpu_groups: $out (${members[*]}) is ${size} MB, over ${LIMIT_MB} MB" >&2
  echo "$out (${size} MB): ${members[*]}"
  echo "  device: DS_CARRY=$out bash tools/device/gpu_tests.sh"
  queue=("${queue[@]:${#members[@]}}")
  group=$((group + 1))
done
