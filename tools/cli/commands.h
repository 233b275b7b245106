// Subcommands of the `deltaserve` binary. Each returns a process exit code and prints one clear
// error line on failure.
#pragma once

namespace ds::cli {

int CmdSynth(int argc, char** argv);     // deltaserve gguf-synth
int CmdLogits(int argc, char** argv);    // deltaserve logits
int CmdGenerate(int argc, char** argv);  // deltaserve generate
int CmdInfo(int argc, char** argv);      // deltaserve info
int CmdBench(int argc, char** argv);     // deltaserve bench (CUDA builds)

}  // namespace ds::cli
