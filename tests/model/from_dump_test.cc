// ExportDumpToGguf (tools/synth/from_dump.h, `deltaserve gguf-from-dump`): a dump written in the
// trainer's format becomes a GGUF whose tensors hold exactly the dumped floats (F32) and which the
// CPU backend loads (F32 and quantized); a missing tensor, a wrong shape, an unknown tensor and a
// vocabulary of the wrong size are clear errors.
#include "tools/synth/from_dump.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/gguf/gguf.h"
#include "common/tokenizer/tokenizer_data.h"
#include "gtest/gtest.h"
#include "tests/model/test_util.h"
#include "tools/synth/synth.h"
#include "worker/model/cpu_backend.h"

namespace ds {
namespace {

struct DumpFixture {
  std::string dir, vocab;
  SynthOptions shape;
  std::map<std::string, std::vector<float>> values;
};

// Writes a dump of the tiny shape (tied output, MTP) with random values; `skip` / `reshape` /
// `extra` break it on purpose.
DumpFixture WriteDump(const std::string& name, const std::string& skip = "",
                      const std::string& reshape = "", bool extra = false, int vocab_delta = 0) {
  DumpFixture f;
  f.dir = testing::TempPath(name);
  std::filesystem::create_directories(f.dir);
  TokenizerData tok = MakeTinyBpe(100);
  gguf::Writer vw;
  WriteTokenizerMetadata(tok, &vw);
  f.vocab = f.dir + "/vocab.gguf";
  EXPECT_TRUE(vw.WriteFile(f.vocab).ok());
  f.shape = SynthOptions::Tiny();
  f.shape.tokenizer = SynthTokenizer::kNone;
  f.shape.n_vocab = static_cast<int>(tok.tokens.size()) + vocab_delta;
  f.shape.tied_output = true;
  auto plan = DescribeGguf(f.shape);
  EXPECT_TRUE(plan.ok());
  std::ofstream man(f.dir + "/manifest.txt");
  man << "deltaserve-dump 1\n";
  const SynthOptions& o = f.shape;
  man << "meta n_layer " << o.n_layer << "\nmeta n_embd " << o.n_embd << "\nmeta n_ff " << o.n_ff
      << "\nmeta n_head " << o.n_head << "\nmeta n_head_kv " << o.n_head_kv << "\nmeta head_dim "
      << o.head_dim << "\nmeta n_rot " << o.n_rot << "\nmeta gdn_k_heads " << o.gdn_k_heads
      << "\nmeta gdn_v_heads " << o.gdn_v_heads << "\nmeta gdn_k_dim " << o.gdn_k_dim
      << "\nmeta gdn_v_dim " << o.gdn_v_dim << "\nmeta conv_kernel " << o.conv_kernel
      << "\nmeta interval " << o.interval << "\nmeta ctx_train " << o.ctx_train << "\nmeta n_vocab "
      << o.n_vocab << "\nmeta with_mtp 1\nmeta tied_output 1\nmeta rope_base 10000\nmeta rms_eps 1e-6\n"
      << "meta general.name test-dump\n";
  std::ofstream bin(f.dir + "/weights.0.bin", std::ios::binary);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 0.1f);
  uint64_t off = 0;
  auto put = [&](const std::string& tname, std::vector<int64_t> ne) {
    int64_t n = 1;
    for (int64_t v : ne) n *= v;
    std::vector<float> x(n);
    for (float& v : x) v = nd(rng);
    if (tname.find("norm") != std::string::npos)
      for (float& v : x) v += 1.0f;
    if (tname.find("ssm_a") != std::string::npos)
      for (float& v : x) v = -std::abs(v) - 0.1f;
    bin.write(reinterpret_cast<const char*>(x.data()), n * 4);
    man << "tensor " << tname << " weights.0.bin " << off;
    for (int64_t v : ne) man << " " << v;
    man << "\n";
    off += n * 4;
    f.values[tname] = std::move(x);
  };
  for (const SynthTensor& t : plan->tensors) {
    if (t.name == skip) continue;
    std::vector<int64_t> ne = t.ne;
    if (t.name == reshape) ne[0] += 1;
    put(t.name, ne);
  }
  if (extra) put("blk.0.bogus.weight", {4});
  return f;
}

TEST(FromDump, F32HoldsTheDumpedFloatsAndLoads) {
  DumpFixture f = WriteDump("dump_ok");
  DumpExportOptions o;
  o.dump_dir = f.dir;
  o.vocab_path = f.vocab;
  const std::string out = f.dir + "/m-f32.gguf";
  ASSERT_TRUE(ExportDumpToGguf(o, out).ok());
  auto file = gguf::File::Open(out);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->tensors().size(), f.values.size());
  EXPECT_EQ((*file)->FindTensor("output.weight"), nullptr);  // tied
  for (const auto& [name, x] : f.values) {
    const gguf::TensorInfo* t = (*file)->FindTensor(name);
    ASSERT_NE(t, nullptr) << name;
    ASSERT_EQ(t->type, GgmlType::F32) << name;
    ASSERT_EQ(t->nbytes, x.size() * 4) << name;
    EXPECT_EQ(std::memcmp(t->data, x.data(), t->nbytes), 0) << name;
  }
  BackendOptions bo;
  bo.slot_ctx = 32;
  bo.n_threads = 1;
  auto be = CpuBackend::Create(out, bo);
  ASSERT_TRUE(be.ok()) << be.status();
  EXPECT_TRUE((*be)->weights().has_mtp);
  SeqStep s{0, 0, {1, 2, 3}, true};
  StepOutput so;
  ASSERT_TRUE((*be)->Forward({&s, 1}, StepOptions{}, &so).ok());
  for (float v : so.logits) ASSERT_TRUE(std::isfinite(v));

  o.weight_type = GgmlType::Q8_0;
  const std::string q = f.dir + "/m-q8_0.gguf";
  ASSERT_TRUE(ExportDumpToGguf(o, q).ok());
  auto qf = gguf::File::Open(q);
  ASSERT_TRUE(qf.ok());
  EXPECT_EQ((*qf)->FindTensor("blk.0.attn_qkv.weight")->type, GgmlType::Q8_0);
  EXPECT_EQ((*qf)->FindTensor("blk.0.ssm_conv1d.weight")->type, GgmlType::F32);
  EXPECT_TRUE(CpuBackend::Create(q, bo).ok());
}

TEST(FromDump, BrokenDumpsAreClearErrors) {
  auto run = [](const DumpFixture& f) {
    DumpExportOptions o;
    o.dump_dir = f.dir;
    o.vocab_path = f.vocab;
    return ExportDumpToGguf(o, f.dir + "/out.gguf");
  };
  absl::Status s = run(WriteDump("dump_missing", "blk.3.attn_k.weight"));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("blk.3.attn_k.weight"), std::string::npos) << s;
  s = run(WriteDump("dump_shape", "", "blk.1.ffn_up.weight"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("blk.1.ffn_up.weight"), std::string::npos) << s;
  s = run(WriteDump("dump_extra", "", "", true));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("bogus"), std::string::npos) << s;
  s = run(WriteDump("dump_vocab", "", "", false, 64));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("n_vocab"), std::string::npos) << s;
  DumpExportOptions o;
  o.dump_dir = testing::TempPath("no_such_dump");
  o.vocab_path = "x";
  EXPECT_EQ(ExportDumpToGguf(o, "/tmp/x.gguf").code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace ds
