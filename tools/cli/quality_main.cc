// ds_quality: the demo-model pipeline's commands without the cluster roles (same code as the
// `deltaserve` subcommands of the same names), small enough to carry to the GPU machine.
#include <cstdio>
#include <cstring>
#include <string>

#include "tools/cli/commands.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: ds_quality perplexity|mtp-accept|gguf-from-dump|bpe-train|tokenize [flags]\n");
    return 2;
  }
  const std::string cmd = argv[1];
  if (cmd == "perplexity") return ds::cli::CmdPerplexity(argc - 2, argv + 2);
  if (cmd == "mtp-accept") return ds::cli::CmdMtpAccept(argc - 2, argv + 2);
  if (cmd == "gguf-from-dump") return ds::cli::CmdGgufFromDump(argc - 2, argv + 2);
  if (cmd == "bpe-train") return ds::cli::CmdBpeTrain(argc - 2, argv + 2);
  if (cmd == "tokenize") return ds::cli::CmdTokenize(argc - 2, argv + 2);
  std::fprintf(stderr, "ds_quality: unknown command '%s'\n", cmd.c_str());
  return 2;
}
