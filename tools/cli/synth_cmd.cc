// `deltaserve gguf-synth`: random-weight qwen35 GGUF files of any shape and weight type.
#include <chrono>
#include <cstdio>
#include <string>

#include "common/gguf/ggml_types.h"
#include "tools/cli/args.h"
#include "tools/cli/commands.h"
#include "tools/synth/synth.h"

namespace ds::cli {

int CmdSynth(int argc, char** argv) {
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "deltaserve: error: %s\n", std::string(s.message()).c_str());
    return 1;
  };
  auto args = Args::Parse(argc, argv,
                          {"--out", "--preset", "--type", "--seed", "--layers", "--tokenizer"},
                          {"--no-mtp"});
  if (!args.ok()) return fail(args.status());
  auto out = args->Required("--out");
  if (!out.ok()) return fail(out.status());
  const std::string preset = args->Str("--preset", "tiny");
  SynthOptions o;
  if (preset == "tiny") {
    o = SynthOptions::Tiny();
  } else if (preset == "27b") {
    o = SynthOptions::Qwen27B();
  } else {
    return fail(absl::InvalidArgumentError("unknown --preset '" + preset + "' (tiny or 27b)"));
  }
  if (args->Has("--type")) {
    auto t = GgmlTypeFromName(args->Str("--type"));
    if (!t || !GgmlInfo(*t).supported)
      return fail(absl::InvalidArgumentError("unsupported --type '" + args->Str("--type") +
                                             "' (F32 F16 BF16 Q8_0 Q4_K Q5_K Q6_K IQ4_XS IQ4_NL)"));
    o.weight_type = *t;
  }
  auto seed = args->UInt("--seed", o.seed);
  if (!seed.ok()) return fail(seed.status());
  o.seed = *seed;
  auto layers = args->Int("--layers", o.n_layer);
  if (!layers.ok()) return fail(layers.status());
  o.n_layer = static_cast<int>(*layers);
  if (args->Has("--no-mtp")) o.with_mtp = false;
  if (args->Has("--tokenizer")) {
    const std::string t = args->Str("--tokenizer");
    if (t == "none") {
      o.tokenizer = SynthTokenizer::kNone;
    } else if (t == "tiny") {
      o.tokenizer = SynthTokenizer::kTinyBpe;
    } else {
      return fail(absl::InvalidArgumentError("--tokenizer must be tiny or none"));
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  if (auto s = SynthesizeGguf(o, *out); !s.ok()) return fail(s);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "wrote %s in %.1f s\n", out->c_str(), secs);
  return 0;
}

}  // namespace ds::cli
