// `deltaserve bench`: the GPU benchmark (tools/bench), available in CUDA builds.
#include <cstdio>

#include "tools/cli/commands.h"
#ifdef DS_HAVE_CUDA
#include "tools/bench/bench.h"
#endif

namespace ds::cli {

int CmdBench(int argc, char** argv) {
#ifdef DS_HAVE_CUDA
  return ds::BenchMain(argc, argv);
#else
  std::fprintf(stderr, "deltaserve: error: bench needs a CUDA build (nvcc was not found)\n");
  return 1;
#endif
}

}  // namespace ds::cli
