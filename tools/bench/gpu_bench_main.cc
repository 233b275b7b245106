// ds_gpu_bench: `deltaserve bench` and `deltaserve gguf-synth` in a binary without the cluster
// (gateway, scheduler, gRPC), for device runs: it builds in a fraction of deltaserve's time and
// carries light. Usage: ds_gpu_bench bench [bench flags] | ds_gpu_bench gguf-synth [synth flags].
#include <cstdio>
#include <cstring>

#include "tools/bench/bench.h"
#include "tools/cli/commands.h"

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "bench") == 0) return ds::BenchMain(argc - 2, argv + 2);
  if (argc >= 2 && std::strcmp(argv[1], "gguf-synth") == 0) return ds::cli::CmdSynth(argc - 2, argv + 2);
  std::fprintf(stderr, "usage: ds_gpu_bench bench [flags] | ds_gpu_bench gguf-synth [flags]\n");
  return 2;
}
