// ExportDumpToGguf (see from_dump.h).
#include "tools/synth/from_dump.h"

#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/gguf/gguf.h"
#include "common/tokenizer/tokenizer_data.h"
#include "common/util/thread_pool.h"
#include "kernels/cpu/quant.h"
#include "tools/synth/synth.h"

namespace ds {
namespace {

struct DumpTensor {
  std::string file;
  uint64_t offset = 0;
  std::vector<int64_t> ne;
};

struct Dump {
  std::map<std::string, std::string> meta;
  std::map<std::string, DumpTensor> tensors;
};

absl::StatusOr<Dump> ReadManifest(const std::string& dir) {
  const std::string path = dir + "/manifest.txt";
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat("gguf-from-dump: cannot open ", path));
  Dump d;
  std::string line;
  int lineno = 0;
  while (std::getline(f, line)) {
    ++lineno;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream in(line);
    std::string kind;
    in >> kind;
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", lineno, ": ", why, ": '", line, "'"));
    };
    if (lineno == 1) {
      if (line != "deltaserve-dump 1") return bad("expected the header 'deltaserve-dump 1'");
      continue;
    }
    if (kind == "meta") {
      std::string key, value;
      in >> key;
      std::getline(in, value);
      if (!value.empty() && value[0] == ' ') value.erase(0, 1);
      if (key.empty() || value.empty()) return bad("meta needs a key and a value");
      d.meta[key] = value;
    } else if (kind == "tensor") {
      std::string name;
      DumpTensor t;
      in >> name >> t.file >> t.offset;
      int64_t v;
      while (in >> v) t.ne.push_back(v);
      if (name.empty() || t.file.empty() || t.ne.empty() || t.ne.size() > 4) return bad("bad tensor line");
      if (t.file.find('/') != std::string::npos) return bad("data file must be inside the dump folder");
      if (!d.tensors.emplace(name, t).second) return bad("tensor listed twice");
    } else {
      return bad("unknown line kind");
    }
  }
  return d;
}

absl::StatusOr<SynthOptions> ShapeFromMeta(const Dump& d) {
  SynthOptions o;
  o.tokenizer = SynthTokenizer::kNone;  // the vocabulary comes from the vocab file
  auto geti = [&](const char* k, int* dst) -> absl::Status {
    auto it = d.meta.find(k);
    if (it == d.meta.end()) return absl::NotFoundError(absl::StrCat("gguf-from-dump: manifest lacks meta ", k));
    if (!absl::SimpleAtoi(it->second, dst))
      return absl::InvalidArgumentError(absl::StrCat("gguf-from-dump: meta ", k, " '", it->second, "' is not an integer"));
    return absl::OkStatus();
  };
  auto getf = [&](const char* k, float* dst) -> absl::Status {
    auto it = d.meta.find(k);
    if (it == d.meta.end()) return absl::NotFoundError(absl::StrCat("gguf-from-dump: manifest lacks meta ", k));
    if (!absl::SimpleAtof(it->second, dst))
      return absl::InvalidArgumentError(absl::StrCat("gguf-from-dump: meta ", k, " '", it->second, "' is not a number"));
    return absl::OkStatus();
  };
  int mtp = 0, tied = 0;
  DS_RETURN_IF_ERROR(geti("n_layer", &o.n_layer));
  DS_RETURN_IF_ERROR(geti("n_embd", &o.n_embd));
  DS_RETURN_IF_ERROR(geti("n_ff", &o.n_ff));
  DS_RETURN_IF_ERROR(geti("n_head", &o.n_head));
  DS_RETURN_IF_ERROR(geti("n_head_kv", &o.n_head_kv));
  DS_RETURN_IF_ERROR(geti("head_dim", &o.head_dim));
  DS_RETURN_IF_ERROR(geti("n_rot", &o.n_rot));
  DS_RETURN_IF_ERROR(geti("gdn_k_heads", &o.gdn_k_heads));
  DS_RETURN_IF_ERROR(geti("gdn_v_heads", &o.gdn_v_heads));
  DS_RETURN_IF_ERROR(geti("gdn_k_dim", &o.gdn_k_dim));
  DS_RETURN_IF_ERROR(geti("gdn_v_dim", &o.gdn_v_dim));
  DS_RETURN_IF_ERROR(geti("conv_kernel", &o.conv_kernel));
  DS_RETURN_IF_ERROR(geti("interval", &o.interval));
  DS_RETURN_IF_ERROR(geti("ctx_train", &o.ctx_train));
  DS_RETURN_IF_ERROR(geti("n_vocab", &o.n_vocab));
  DS_RETURN_IF_ERROR(geti("with_mtp", &mtp));
  DS_RETURN_IF_ERROR(geti("tied_output", &tied));
  DS_RETURN_IF_ERROR(getf("rope_base", &o.rope_base));
  DS_RETURN_IF_ERROR(getf("rms_eps", &o.rms_eps));
  o.with_mtp = mtp != 0;
  o.tied_output = tied != 0;
  return o;
}

// ChatML, the format common/tokenizer/chat_format.cc produces (written for other tools' benefit).
constexpr const char kChatTemplate[] =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' "
    "}}{% endif %}";

}  // namespace

absl::Status ExportDumpToGguf(const DumpExportOptions& opts, const std::string& out_path) {
  DS_ASSIGN_OR_RETURN(Dump dump, ReadManifest(opts.dump_dir));
  DS_ASSIGN_OR_RETURN(SynthOptions shape, ShapeFromMeta(dump));
  shape.weight_type = opts.weight_type;
  DS_ASSIGN_OR_RETURN(auto vocab_file, gguf::File::Open(opts.vocab_path));
  DS_ASSIGN_OR_RETURN(TokenizerData tok, ReadTokenizerData(*vocab_file));
  if (static_cast<int>(tok.tokens.size()) != shape.n_vocab)
    return absl::InvalidArgumentError(absl::StrCat("gguf-from-dump: the vocabulary has ", tok.tokens.size(),
                                                   " tokens but the dump's n_vocab is ", shape.n_vocab));
  DS_ASSIGN_OR_RETURN(SynthPlan plan, DescribeGguf(shape));

  // The dump must hold exactly the planned tensors, with the planned shapes.
  for (const SynthTensor& t : plan.tensors) {
    auto it = dump.tensors.find(t.name);
    if (it == dump.tensors.end())
      return absl::NotFoundError(absl::StrCat("gguf-from-dump: the dump lacks tensor ", t.name));
    if (it->second.ne != t.ne)
      return absl::InvalidArgumentError(absl::StrCat("gguf-from-dump: tensor ", t.name, " has the wrong shape"));
  }
  if (dump.tensors.size() != plan.tensors.size())
    for (const auto& [name, t] : dump.tensors) {
      bool planned = false;
      for (const SynthTensor& p : plan.tensors) planned |= p.name == name;
      if (!planned)
        return absl::InvalidArgumentError(absl::StrCat("gguf-from-dump: unexpected tensor ", name,
                                                       " for this model shape"));
    }
  // Every data file must be large enough for what the manifest says it holds.
  for (const auto& [name, t] : dump.tensors) {
    int64_t n = 1;
    for (int64_t v : t.ne) n *= v;
    std::ifstream f(opts.dump_dir + "/" + t.file, std::ios::binary | std::ios::ate);
    if (!f) return absl::NotFoundError(absl::StrCat("gguf-from-dump: cannot open ", t.file, " (tensor ", name, ")"));
    const uint64_t size = static_cast<uint64_t>(f.tellg());
    if (t.offset + static_cast<uint64_t>(n) * 4 > size)
      return absl::OutOfRangeError(absl::StrCat("gguf-from-dump: tensor ", name, " runs past the end of ", t.file));
  }

  gguf::Writer w;
  auto name_it = dump.meta.find("general.name");
  WriteQwen35Metadata(shape, shape.n_vocab,
                      absl::StrCat(name_it != dump.meta.end() ? name_it->second : std::string("deltaserve-demo"),
                                   "-", std::string(GgmlInfo(opts.weight_type).name)),
                      &w);
  for (const auto& [k, v] : dump.meta)
    if (k.rfind("general.", 0) == 0 && k != "general.name") w.AddString(k, v);
  WriteTokenizerMetadata(tok, &w);
  w.AddString("tokenizer.chat_template", kChatTemplate);

  auto pool = std::make_shared<ThreadPool>(opts.n_threads);
  const std::string dir = opts.dump_dir;
  for (const SynthTensor& t : plan.tensors) {
    const DumpTensor src = dump.tensors.at(t.name);
    const GgmlType type = t.type;
    w.AddTensor(t.name, t.ne, type, [src, type, dir, pool](uint8_t* dst, uint64_t nbytes) {
      const int64_t cols = src.ne[0];
      const uint64_t row_bytes = GgmlRowBytes(type, cols);
      const int64_t rows = static_cast<int64_t>(nbytes / row_bytes);
      std::vector<float> all(static_cast<size_t>(rows * cols));
      std::ifstream f(dir + "/" + src.file, std::ios::binary);
      f.seekg(static_cast<std::streamoff>(src.offset));
      f.read(reinterpret_cast<char*>(all.data()), static_cast<std::streamsize>(all.size() * 4));
      // Sizes were checked before writing began, so a short read here is an I/O failure; it
      // leaves zeros, which the checksum and the CI test would catch.
      pool->ParallelFor(
          rows,
          [&](int64_t r0, int64_t r1) {
            for (int64_t r = r0; r < r1; ++r)
              cpu::QuantizeRow(type, all.data() + r * cols, dst + r * row_bytes, cols);
          },
          /*grain=*/16);
    });
  }
  return w.WriteFile(out_path);
}

}  // namespace ds
