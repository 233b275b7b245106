// Subcommands of the `deltaserve` binary. Each returns a process exit code and prints one clear
// error line on failure.
#pragma once

namespace ds::cli {

int CmdSynth(int argc, char** argv);     // deltaserve gguf-synth
int CmdLogits(int argc, char** argv);    // deltaserve logits
int CmdGenerate(int argc, char** argv);  // deltaserve generate
int CmdInfo(int argc, char** argv);      // deltaserve info
int CmdBench(int argc, char** argv);     // deltaserve bench (CUDA builds)
int CmdTpPlan(int argc, char** argv);    // deltaserve tp-plan (tools/cli/tp_plan.h)
int CmdBpeTrain(int argc, char** argv);       // deltaserve bpe-train
int CmdTokenize(int argc, char** argv);       // deltaserve tokenize
int CmdGgufFromDump(int argc, char** argv);   // deltaserve gguf-from-dump
int CmdPerplexity(int argc, char** argv);     // deltaserve perplexity
int CmdMtpAccept(int argc, char** argv);      // deltaserve mtp-accept

}  // namespace ds::cli
