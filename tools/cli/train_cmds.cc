// Commands of the demo-model pipeline (tools/train/README.md): `bpe-train` (vocabulary from a text
// file), `tokenize` (text file -> token ids for the PyTorch trainer) and `gguf-from-dump` (the
// trainer's f32 tensors -> a qwen35 GGUF of any supported weight type).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "common/gguf/ggml_types.h"
#include "common/gguf/gguf.h"
#include "common/tokenizer/bpe_trainer.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/model_alias.h"
#include "tools/cli/args.h"
#include "tools/cli/commands.h"
#include "tools/synth/from_dump.h"

namespace ds::cli {
namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "deltaserve: error: %s\n", std::string(s.message()).c_str());
  return 1;
}

absl::StatusOr<std::string> ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError("cannot open " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int CmdBpeTrain(int argc, char** argv) {
  auto args = Args::Parse(argc, argv, {"--text", "--vocab-size", "--out"}, {});
  if (!args.ok()) return Fail(args.status());
  auto text_path = args->Required("--text");
  auto out = args->Required("--out");
  if (!text_path.ok()) return Fail(text_path.status());
  if (!out.ok()) return Fail(out.status());
  auto vs = args->Int("--vocab-size", 4096);
  if (!vs.ok()) return Fail(vs.status());
  auto text = ReadAll(*text_path);
  if (!text.ok()) return Fail(text.status());
  const auto t0 = std::chrono::steady_clock::now();
  BpeTrainOptions o;
  o.vocab_size = static_cast<int>(*vs);
  auto data = TrainBpe(*text, o);
  if (!data.ok()) return Fail(data.status());
  // A vocabulary-only GGUF: the tokenizer keys and nothing else.
  gguf::Writer w;
  w.AddString("general.type", "vocabulary");
  WriteTokenizerMetadata(*data, &w);
  if (auto s = w.WriteFile(*out); !s.ok()) return Fail(s);
  std::fprintf(stderr, "bpe-train: %zu tokens (%zu merges) from %zu bytes in %.1f s -> %s\n",
               data->tokens.size(), data->merges.size(), text->size(), Since(t0), out->c_str());
  return 0;
}

int CmdTokenize(int argc, char** argv) {
  auto args = Args::Parse(argc, argv, {"--model", "--text", "--out"}, {"--no-special"});
  if (!args.ok()) return Fail(args.status());
  auto model = args->Required("--model");
  auto text_path = args->Required("--text");
  auto out = args->Required("--out");
  for (const absl::Status& s : {model.status(), text_path.status(), out.status()})
    if (!s.ok()) return Fail(s);
  auto file = gguf::File::Open(ResolveModelAlias(*model));
  if (!file.ok()) return Fail(file.status());
  auto tok = Tokenizer::FromGguf(**file);
  if (!tok.ok()) return Fail(tok.status());
  if (tok->n_vocab() > 65536)
    return Fail(absl::InvalidArgumentError("tokenize writes uint16 ids; the vocabulary is larger"));
  auto text = ReadAll(*text_path);
  if (!text.ok()) return Fail(text.status());
  const auto t0 = std::chrono::steady_clock::now();
  // Control-token texts in the corpus (<|endoftext|> between documents, the ChatML markers of the
  // chat examples) become their ids unless --no-special.
  auto ids = tok->Encode(*text, /*parse_special=*/!args->Has("--no-special"));
  if (!ids.ok()) return Fail(ids.status());
  std::vector<uint16_t> u16(ids->begin(), ids->end());
  std::ofstream f(*out, std::ios::binary);
  f.write(reinterpret_cast<const char*>(u16.data()), static_cast<std::streamsize>(u16.size() * 2));
  if (!f) return Fail(absl::InternalError("cannot write " + *out));
  std::fprintf(stderr, "tokenize: %zu bytes -> %zu tokens (%.2f bytes/token) in %.1f s -> %s (uint16 LE)\n",
               text->size(), ids->size(), static_cast<double>(text->size()) / std::max<size_t>(1, ids->size()),
               Since(t0), out->c_str());
  return 0;
}

int CmdGgufFromDump(int argc, char** argv) {
  auto args = Args::Parse(argc, argv, {"--dump", "--vocab", "--type", "--out", "--threads"}, {});
  if (!args.ok()) return Fail(args.status());
  auto dump = args->Required("--dump");
  auto vocab = args->Required("--vocab");
  auto out = args->Required("--out");
  for (const absl::Status& s : {dump.status(), vocab.status(), out.status()})
    if (!s.ok()) return Fail(s);
  DumpExportOptions o;
  o.dump_dir = *dump;
  o.vocab_path = *vocab;
  auto t = GgmlTypeFromName(args->Str("--type", "F32"));
  if (!t || !GgmlInfo(*t).supported)
    return Fail(absl::InvalidArgumentError("unsupported --type '" + args->Str("--type") +
                                           "' (F32 F16 BF16 Q8_0 Q4_K Q5_K Q6_K IQ4_XS IQ4_NL)"));
  o.weight_type = *t;
  auto threads = args->Int("--threads", 0);
  if (!threads.ok()) return Fail(threads.status());
  o.n_threads = static_cast<int>(*threads);
  const auto t0 = std::chrono::steady_clock::now();
  if (auto s = ExportDumpToGguf(o, *out); !s.ok()) return Fail(s);
  std::fprintf(stderr, "gguf-from-dump: wrote %s (%s) in %.1f s\n", out->c_str(), std::string(GgmlInfo(*t).name).c_str(),
               Since(t0));
  return 0;
}

}  // namespace ds::cli
