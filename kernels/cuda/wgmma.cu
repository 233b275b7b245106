// The host's one check for the warpgroup tensor-core kernels (wgmma.cuh): their bodies exist only
// where sm_90a code is compiled (DS_WGMMA), and that code runs on compute capability 9.0 only.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace ds::cuda {
namespace {

__global__ void WgmmaProbeKernel(int* out) { *out = DS_WGMMA; }

}  // namespace

bool WgmmaAvailable() {
  static const bool available = ProbeWritesOne(WgmmaProbeKernel, 90, 90);
  return available;
}

}  // namespace ds::cuda
