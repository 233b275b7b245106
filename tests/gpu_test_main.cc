// main() of the GPU-labelled tests: GoogleTest's, plus the run-wide switches of
// tests/gpu_test_options.h. `--portable` (or DS_TEST_PORTABLE=1 in the environment, for ctest
// runs) forces the portable (sm_70) kernel path; it is read here and nowhere else.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "tests/gpu_test_options.h"

namespace ds::testing {
namespace {
bool g_portable = false;
}  // namespace
bool ForcePortable() { return g_portable; }
}  // namespace ds::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const char* env = std::getenv("DS_TEST_PORTABLE");
  ds::testing::g_portable = env != nullptr && std::strcmp(env, "1") == 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--portable") == 0) {
      ds::testing::g_portable = true;
    } else {
      std::fprintf(stderr, "unknown argument %s (expected --portable or --gtest_*)\n", argv[i]);
      return 2;
    }
  }
  if (ds::testing::g_portable)
    std::printf("GPU tests on the portable (sm_70) kernel path (CudaBackendOptions::portable)\n");
  return RUN_ALL_TESTS();
}
