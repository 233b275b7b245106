// deltaserve: one binary, several roles. See README.md for the contract of each subcommand.
#include <cstdio>
#include <cstring>
#include <string>

#include "scheduler/daemon/daemon.h"
#include "tools/cli/commands.h"
#include "tools/serve/serve.h"
#include "worker/process/worker_process.h"

namespace {

void Usage() {
  std::fprintf(stderr,
               "usage: deltaserve <command> [flags]\n"
               "commands:\n"
               "  gguf-synth  write a random-weight qwen35 GGUF (--preset tiny|27b --out FILE)\n"
               "  logits      --model FILE --prompt-ids 1,2,3 --out FILE.f32\n"
               "  generate    --model FILE (--prompt TEXT | --prompt-ids 1,2,3) --max-tokens N\n"
               "              [--mtp K|auto] [--portable] and the worker's device switches\n"
               "              (--dense-weights, --tiled-f16-formats, --early-launch, --gdn-state ...)\n"
               "  info        --model FILE: print the model's configuration\n"
               "  perplexity  --model FILE --text FILE [--ctx N]: perplexity over a text\n"
               "  mtp-accept  --model FILE --text FILE [--draft K]: MTP draft acceptance per position\n"
               "  bpe-train   --text FILE --vocab-size N --out VOCAB.gguf (demo model pipeline)\n"
               "  tokenize    --model FILE --text FILE --out IDS.u16\n"
               "  gguf-from-dump --dump DIR --vocab VOCAB.gguf --type T --out FILE\n"
               "  (--model demo names the committed demo model, models/demo/)\n"
               "  bench       GPU benchmark (CUDA builds)\n"
               "  tp-plan     TP split + memory plan per card, no GPU needed (--cards-mib 16160,32510\n"
               "              --synth 27b --mix q4_k_m | --model FILE; --kv-type --ctx --split)\n"
               "  scheduler   scheduler daemon (--listen 127.0.0.1:PORT --slots N --ctx N ...)\n"
               "  worker      worker process (--scheduler HOST:PORT --model FILE --backend ...)\n"
               "  gateway     public gRPC gateway (--listen A --admin-listen A --scheduler A --model FILE)\n"
               "  serve       all roles locally (--model FILE [--slots N --ctx N --port P] [--demo PROMPT])\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    Usage();
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  int sub_argc = argc - 2;
  char** sub_argv = argv + 2;
  if (cmd == "gguf-synth") return ds::cli::CmdSynth(sub_argc, sub_argv);
  if (cmd == "logits") return ds::cli::CmdLogits(sub_argc, sub_argv);
  if (cmd == "generate") return ds::cli::CmdGenerate(sub_argc, sub_argv);
  if (cmd == "info") return ds::cli::CmdInfo(sub_argc, sub_argv);
  if (cmd == "perplexity") return ds::cli::CmdPerplexity(sub_argc, sub_argv);
  if (cmd == "mtp-accept") return ds::cli::CmdMtpAccept(sub_argc, sub_argv);
  if (cmd == "bpe-train") return ds::cli::CmdBpeTrain(sub_argc, sub_argv);
  if (cmd == "tokenize") return ds::cli::CmdTokenize(sub_argc, sub_argv);
  if (cmd == "gguf-from-dump") return ds::cli::CmdGgufFromDump(sub_argc, sub_argv);
  if (cmd == "bench") return ds::cli::CmdBench(sub_argc, sub_argv);
  if (cmd == "tp-plan") return ds::cli::CmdTpPlan(sub_argc, sub_argv);
  if (cmd == "scheduler") return ds::RunSchedulerDaemon(sub_argc, sub_argv);
  if (cmd == "worker") return ds::RunWorkerProcess(sub_argc, sub_argv);
  if (cmd == "gateway") return ds::RunGateway(sub_argc, sub_argv);
  if (cmd == "serve") return ds::RunServe(sub_argc, sub_argv);
  std::fprintf(stderr, "deltaserve: unknown command '%s'\n", cmd.c_str());
  Usage();
  return 2;
}
