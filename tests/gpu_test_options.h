// The GPU tests' run-wide switches, set by their main (tests/gpu_test_main.cc) from the command
// line or the environment, never read by library code (options stay structs): with
// `--portable` (or DS_TEST_PORTABLE=1) every backend a GPU test creates runs the portable
// (sm_70 / V100) kernel path (CudaBackendOptions::portable, issue #19), so the kernels a V100
// would run pass the same tests on the H200.
#pragma once

namespace ds::testing {

bool ForcePortable();

// BackendOptions / CudaBackendOptions with the run-wide switches applied.
template <typename Options>
Options& GpuTestOptions(Options& o) {
  if (ForcePortable()) o.portable = true;
  return o;
}

}  // namespace ds::testing
