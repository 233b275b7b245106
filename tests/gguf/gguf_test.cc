// GGUF writer -> reader round trips, typed getters, and writer-side validation.
#include "common/gguf/gguf.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include "tests/gguf/raw_gguf.h"

namespace ds::gguf {
namespace {

using ::ds::gguf::testing::ExactBuffer;

Value UV(ValueType t, uint64_t x) { return Value{t, x}; }
Value SV(ValueType t, int64_t x) { return Value{t, x}; }
Value FV(ValueType t, double x) { return Value{t, x}; }
Value StrV(std::string s) { return Value{ValueType::STRING, std::move(s)}; }
Value ArrV(ValueType et, std::vector<Value> items) {
  return Value{ValueType::ARRAY, Array{et, std::move(items)}};
}

uint8_t Pattern(uint64_t i, int seed) { return static_cast<uint8_t>((i * 131 + seed * 17) >> 1); }

Writer::Fill PatternFill(int seed) {
  return [seed](uint8_t* dst, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) dst[i] = Pattern(i, seed);
  };
}

absl::StatusOr<std::unique_ptr<File>> ParseCopy(const std::vector<uint8_t>& image,
                                                std::unique_ptr<ExactBuffer>* keep) {
  *keep = std::make_unique<ExactBuffer>(image);
  return File::Parse((*keep)->data.get(), (*keep)->size);
}

// Every value type, nested arrays, odd strings.
std::vector<std::pair<std::string, Value>> AllValues() {
  std::vector<std::pair<std::string, Value>> kv;
  kv.emplace_back("t.u8", UV(ValueType::U8, 255));
  kv.emplace_back("t.i8", SV(ValueType::I8, -128));
  kv.emplace_back("t.u16", UV(ValueType::U16, 65535));
  kv.emplace_back("t.i16", SV(ValueType::I16, -32768));
  kv.emplace_back("t.u32", UV(ValueType::U32, 4000000000u));
  kv.emplace_back("t.i32", SV(ValueType::I32, std::numeric_limits<int32_t>::min()));
  kv.emplace_back("t.f32", FV(ValueType::F32, static_cast<double>(1e-6f)));
  kv.emplace_back("t.bool_true", Value{ValueType::BOOL, true});
  kv.emplace_back("t.bool_false", Value{ValueType::BOOL, false});
  kv.emplace_back("t.string", StrV("héllo \xe4\xb8\x96\xe7\x95\x8c"));
  kv.emplace_back("t.string_empty", StrV(""));
  kv.emplace_back("t.string_nul", StrV(std::string("a\0b", 3)));
  kv.emplace_back("t.u64", UV(ValueType::U64, std::numeric_limits<uint64_t>::max()));
  kv.emplace_back("t.i64", SV(ValueType::I64, std::numeric_limits<int64_t>::min()));
  kv.emplace_back("t.f64", FV(ValueType::F64, -1.0 / 3.0));
  kv.emplace_back("t.f64_nan", FV(ValueType::F64, std::nan("")));
  kv.emplace_back("t.arr_u8", ArrV(ValueType::U8, {UV(ValueType::U8, 0), UV(ValueType::U8, 9)}));
  kv.emplace_back("t.arr_i8", ArrV(ValueType::I8, {SV(ValueType::I8, -1)}));
  kv.emplace_back("t.arr_u16",
                  ArrV(ValueType::U16, {UV(ValueType::U16, 1), UV(ValueType::U16, 2)}));
  kv.emplace_back("t.arr_i16", ArrV(ValueType::I16, {SV(ValueType::I16, -2)}));
  kv.emplace_back("t.arr_u32", ArrV(ValueType::U32, {UV(ValueType::U32, 7)}));
  kv.emplace_back("t.arr_i32",
                  ArrV(ValueType::I32, {SV(ValueType::I32, 11), SV(ValueType::I32, 11),
                                        SV(ValueType::I32, 10), SV(ValueType::I32, 0)}));
  kv.emplace_back("t.arr_f32",
                  ArrV(ValueType::F32, {FV(ValueType::F32, 0.5), FV(ValueType::F32, -2)}));
  kv.emplace_back("t.arr_bool", ArrV(ValueType::BOOL, {Value{ValueType::BOOL, true},
                                                       Value{ValueType::BOOL, false}}));
  kv.emplace_back("t.arr_string", ArrV(ValueType::STRING, {StrV("a b"), StrV(""), StrV("Ġhello")}));
  kv.emplace_back("t.arr_u64", ArrV(ValueType::U64, {UV(ValueType::U64, 1ull << 63)}));
  kv.emplace_back("t.arr_i64", ArrV(ValueType::I64, {SV(ValueType::I64, -(1ll << 40))}));
  kv.emplace_back("t.arr_f64", ArrV(ValueType::F64, {FV(ValueType::F64, 1e300)}));
  kv.emplace_back("t.arr_empty", ArrV(ValueType::F64, {}));
  kv.emplace_back("t.arr_nested",
                  ArrV(ValueType::ARRAY,
                       {ArrV(ValueType::STRING, {StrV("x"), StrV("yz")}),
                        ArrV(ValueType::ARRAY, {ArrV(ValueType::I32, {SV(ValueType::I32, 5)})}),
                        ArrV(ValueType::U8, {})}));
  return kv;
}

struct TensorSpec {
  std::string name;
  std::vector<int64_t> ne;
  GgmlType type;
};

std::vector<TensorSpec> AllTensors() {
  return {
      {"token_embd.weight", {8, 3}, GgmlType::F16},
      {"output_norm.weight", {7}, GgmlType::F32},
      {"blk.0.attn_qkv.weight", {64, 3, 2}, GgmlType::Q8_0},
      {"blk.0.ffn_up.weight", {256, 2, 1, 2}, GgmlType::Q4_K},
      {"blk.0.ffn_down.weight", {256, 1}, GgmlType::Q6_K},
      {"blk.0.ssm_conv1d.weight", {2, 2, 2, 2}, GgmlType::BF16},
      {"blk.0.attn_gate.weight", {512, 1}, GgmlType::IQ4_XS},
      {"blk.0.ssm_out.weight", {256}, GgmlType::Q5_K},
      {"legacy.q4_0", {32, 2}, GgmlType::Q4_0},  // known but unsupported: still parses
  };
}

void AddAll(Writer& w) {
  for (auto& [k, v] : AllValues()) w.AddValue(k, v);
  w.AddU32("conv.u32", 17);
  w.AddI32("conv.i32", -17);
  w.AddU64("conv.u64", 1ull << 40);
  w.AddF32("conv.f32", 0.25f);
  w.AddBool("conv.bool", true);
  w.AddString("conv.string", "qwen35");
  w.AddStringArray("conv.strings", {"<|im_start|>", "<|im_end|>"});
  w.AddI32Array("conv.i32s", {11, 11, 10, 0});
  w.AddF32Array("conv.f32s", {1.5f, -0.0f});
  int seed = 0;
  for (const auto& t : AllTensors()) w.AddTensor(t.name, t.ne, t.type, PatternFill(seed++));
}

void CheckAll(const File& f, uint64_t alignment) {
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), alignment);
  for (const auto& [k, v] : AllValues()) {
    const Value* got = f.Find(k);
    ASSERT_NE(got, nullptr) << k;
    EXPECT_TRUE(SameValue(*got, v)) << k;
  }
  EXPECT_EQ(*f.GetUInt("conv.u32"), 17u);
  EXPECT_EQ(f.Find("conv.u32")->type, ValueType::U32);
  EXPECT_EQ(*f.GetInt("conv.i32"), -17);
  EXPECT_EQ(f.Find("conv.i32")->type, ValueType::I32);
  EXPECT_EQ(*f.GetUInt("conv.u64"), 1ull << 40);
  EXPECT_EQ(*f.GetFloat("conv.f32"), 0.25);
  EXPECT_EQ(*f.GetBool("conv.bool"), true);
  EXPECT_EQ(*f.GetString("conv.string"), "qwen35");
  EXPECT_EQ(*f.GetStringArray("conv.strings"),
            (std::vector<std::string>{"<|im_start|>", "<|im_end|>"}));
  EXPECT_EQ(*f.GetIntArray("conv.i32s"), (std::vector<int64_t>{11, 11, 10, 0}));
  const auto f32s = *f.GetFloatArray("conv.f32s");
  ASSERT_EQ(f32s.size(), 2u);
  EXPECT_EQ(f32s[0], 1.5f);
  EXPECT_TRUE(std::signbit(f32s[1]));

  const auto specs = AllTensors();
  ASSERT_EQ(f.tensors().size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorSpec& s = specs[i];
    auto t = f.GetTensor(s.name);
    ASSERT_TRUE(t.ok()) << t.status();
    const TensorInfo& ti = **t;
    EXPECT_EQ(&ti, &f.tensors()[i]);
    EXPECT_EQ(ti.name, s.name);
    EXPECT_EQ(ti.type, s.type);
    ASSERT_EQ(ti.n_dims, static_cast<int>(s.ne.size()));
    for (int d = 0; d < 4; ++d) EXPECT_EQ(ti.ne[d], d < ti.n_dims ? s.ne[d] : 1) << s.name;
    const auto& info = GgmlInfo(s.type);
    EXPECT_EQ(ti.nbytes,
              static_cast<uint64_t>(ti.n_elements() / info.block_elems * info.block_bytes));
    EXPECT_EQ(ti.nbytes, ti.row_bytes() * ti.n_rows());
    EXPECT_EQ(ti.offset % alignment, 0u);
    ASSERT_NE(ti.data, nullptr);
    EXPECT_EQ(static_cast<uint64_t>(ti.data - f.base()) % alignment, 0u);
    ASSERT_LE(ti.data + ti.nbytes, f.base() + f.size());
    for (uint64_t b = 0; b < ti.nbytes; ++b) {
      ASSERT_EQ(ti.data[b], Pattern(b, static_cast<int>(i))) << s.name << " byte " << b;
    }
  }
}

TEST(GgufRoundTrip, AllValueTypesAndTensorsInMemory) {
  Writer w;
  AddAll(w);
  auto img = w.WriteToMemory();
  ASSERT_TRUE(img.ok()) << img.status();
  std::unique_ptr<ExactBuffer> keep;
  auto f = ParseCopy(*img, &keep);
  ASSERT_TRUE(f.ok()) << f.status();
  CheckAll(**f, 32);
  EXPECT_EQ((*f)->Find("general.alignment"), nullptr);  // default alignment is not written
  // The file ends right after the last tensor (no trailing padding).
  const TensorInfo& last = (*f)->tensors().back();
  EXPECT_EQ(last.data + last.nbytes, (*f)->base() + (*f)->size());
}

TEST(GgufRoundTrip, NonDefaultAlignmentIsWrittenAndHonoured) {
  for (uint32_t a : {1u, 8u, 64u, 4096u}) {
    Writer w;
    w.SetAlignment(a);
    AddAll(w);
    auto img = w.WriteToMemory();
    ASSERT_TRUE(img.ok()) << img.status();
    std::unique_ptr<ExactBuffer> keep;
    auto f = ParseCopy(*img, &keep);
    ASSERT_TRUE(f.ok()) << f.status();
    CheckAll(**f, a);
    EXPECT_EQ(*(*f)->GetUInt("general.alignment"), a);
    EXPECT_EQ((*f)->Find("general.alignment")->type, ValueType::U32);
  }
}

TEST(GgufRoundTrip, ExplicitAlignmentKeyMatchingWriterIsWrittenOnce) {
  Writer w;
  w.SetAlignment(64);
  w.AddU32("general.alignment", 64);
  w.AddTensor("a", {4}, GgmlType::F32, PatternFill(0));
  auto img = w.WriteToMemory();
  ASSERT_TRUE(img.ok()) << img.status();
  auto f = File::Parse(img->data(), img->size());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->metadata().size(), 1u);
  EXPECT_EQ((*f)->alignment(), 64u);
}

TEST(GgufRoundTrip, FileOnDiskMatchesMemoryImage) {
  Writer w;
  AddAll(w);
  const std::string path =
      ::testing::TempDir() + "/gguf_roundtrip_" + std::to_string(getpid()) + ".gguf";
  ASSERT_TRUE(w.WriteFile(path).ok());
  auto mem = w.WriteToMemory();
  ASSERT_TRUE(mem.ok());
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> disk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(disk, *mem);
  auto f = File::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  CheckAll(**f, 32);
  f->reset();
  unlink(path.c_str());
}

TEST(GgufRoundTrip, FillCalledOncePerTensorInOrderWithExactSize) {
  Writer w;
  std::vector<std::pair<std::string, uint64_t>> calls;
  for (const auto& t : AllTensors()) {
    w.AddTensor(t.name, t.ne, t.type, [&calls, name = t.name](uint8_t* dst, uint64_t n) {
      calls.emplace_back(name, n);
      std::memset(dst, 0xAB, n);
    });
  }
  auto img = w.WriteToMemory();
  ASSERT_TRUE(img.ok()) << img.status();
  auto f = File::Parse(img->data(), img->size());
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(calls.size(), AllTensors().size());
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].first, (*f)->tensors()[i].name);
    EXPECT_EQ(calls[i].second, (*f)->tensors()[i].nbytes);
  }
}

TEST(GgufRoundTrip, LargeTensorSpanningWriteBuffer) {
  // 12 MiB tensor + a small one: exercises buffered and direct writes to disk.
  Writer w;
  w.AddString("general.architecture", "qwen35");
  w.AddTensor("big", {1024, 3072}, GgmlType::F32, PatternFill(3));
  w.AddTensor("small", {5}, GgmlType::F32, PatternFill(4));
  const std::string path = ::testing::TempDir() + "/gguf_big_" + std::to_string(getpid()) + ".gguf";
  ASSERT_TRUE(w.WriteFile(path).ok());
  auto f = File::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  const TensorInfo* big = (*f)->FindTensor("big");
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(big->nbytes, 1024u * 3072 * 4);
  for (uint64_t b = 0; b < big->nbytes; b += 4093) ASSERT_EQ(big->data[b], Pattern(b, 3));
  const TensorInfo* small = (*f)->FindTensor("small");
  ASSERT_NE(small, nullptr);
  for (uint64_t b = 0; b < small->nbytes; ++b) ASSERT_EQ(small->data[b], Pattern(b, 4));
  unlink(path.c_str());
}

TEST(GgufRoundTrip, TensorBytesAndLongNames) {
  Writer w;
  const std::string long_name(200, 'n');  // > 64 (spec) but within our cap
  std::vector<uint8_t> bytes(34 * 2);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i);
  w.AddTensorBytes(long_name, {32, 2}, GgmlType::Q8_0, bytes);
  auto img = w.WriteToMemory();
  ASSERT_TRUE(img.ok()) << img.status();
  auto f = File::Parse(img->data(), img->size());
  ASSERT_TRUE(f.ok()) << f.status();
  const TensorInfo* t = (*f)->FindTensor(long_name);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(std::vector<uint8_t>(t->data, t->data + t->nbytes), bytes);
}

TEST(GgufRoundTrip, MaxNestingDepthAccepted) {
  Value v = ArrV(ValueType::U8, {UV(ValueType::U8, 1)});
  for (int d = 1; d < kMaxArrayDepth; ++d) v = ArrV(ValueType::ARRAY, {v});
  Writer w;
  w.AddValue("deep", v);
  auto img = w.WriteToMemory();
  ASSERT_TRUE(img.ok()) << img.status();
  auto f = File::Parse(img->data(), img->size());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(SameValue(*(*f)->Find("deep"), v));
}

TEST(GgufRoundTrip, EmptyFileHasOnlyHeader) {
  Writer w;
  auto img = w.WriteToMemory();
  ASSERT_TRUE(img.ok());
  EXPECT_EQ(img->size(), 24u);
  auto f = File::Parse(img->data(), img->size());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE((*f)->metadata().empty());
  EXPECT_TRUE((*f)->tensors().empty());
}

// ---- getters ------------------------------------------------------------------------------------

class GgufGetters : public ::testing::Test {
 protected:
  void SetUp() override {
    Writer w;
    w.AddValue("u8", UV(ValueType::U8, 200));
    w.AddValue("i8_neg", SV(ValueType::I8, -5));
    w.AddValue("i16_pos", SV(ValueType::I16, 300));
    w.AddValue("u16", UV(ValueType::U16, 65000));
    w.AddU32("qwen35.embedding_length", 5120);
    w.AddI32("i32_pos", 7);
    w.AddI32("i32_neg", -7);
    w.AddValue("u64_big", UV(ValueType::U64, (1ull << 63) + 5));
    w.AddValue("i64_neg", SV(ValueType::I64, -(1ll << 40)));
    w.AddF32("qwen35.rope.freq_base", 1e7f);
    w.AddValue("f64", FV(ValueType::F64, 0.125));
    w.AddBool("flag", false);
    w.AddString("name", "model");
    w.AddStringArray("tokens", {"a", "b", "c"});
    w.AddI32Array("sections", {11, 11, 10, 0});
    w.AddValue("u64s", ArrV(ValueType::U64, {UV(ValueType::U64, 1), UV(ValueType::U64, ~0ull)}));
    w.AddF32Array("f32s", {0.5f, 2.0f});
    w.AddValue("f64s", ArrV(ValueType::F64, {FV(ValueType::F64, 0.25)}));
    w.AddValue("nested", ArrV(ValueType::ARRAY, {ArrV(ValueType::I32, {})}));
    w.AddTensor("blk.0.attn_norm.weight", {16}, GgmlType::F32, PatternFill(1));
    auto img = w.WriteToMemory();
    ASSERT_TRUE(img.ok()) << img.status();
    image_ = std::move(*img);
    auto f = File::Parse(image_.data(), image_.size());
    ASSERT_TRUE(f.ok()) << f.status();
    f_ = std::move(*f);
  }
  std::vector<uint8_t> image_;
  std::unique_ptr<File> f_;
};

void ExpectInvalid(const absl::Status& s, std::vector<std::string> needles) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  for (const auto& n : needles)
    EXPECT_NE(s.message().find(n), std::string::npos) << s << " / " << n;
}

TEST_F(GgufGetters, UIntAcceptsAnyNonNegativeInteger) {
  EXPECT_EQ(*f_->GetUInt("u8"), 200u);
  EXPECT_EQ(*f_->GetUInt("u16"), 65000u);
  EXPECT_EQ(*f_->GetUInt("i16_pos"), 300u);
  EXPECT_EQ(*f_->GetUInt("qwen35.embedding_length"), 5120u);
  EXPECT_EQ(*f_->GetUInt("i32_pos"), 7u);
  EXPECT_EQ(*f_->GetUInt("u64_big"), (1ull << 63) + 5);
  ExpectInvalid(f_->GetUInt("i8_neg").status(), {"'i8_neg'", "negative", "-5"});
  ExpectInvalid(f_->GetUInt("i32_neg").status(), {"'i32_neg'", "-7"});
  ExpectInvalid(f_->GetUInt("f64").status(), {"'f64'", "f64", "unsigned integer"});
  ExpectInvalid(f_->GetUInt("name").status(), {"'name'", "string"});
}

TEST_F(GgufGetters, IntAcceptsIntegersThatFitInt64) {
  EXPECT_EQ(*f_->GetInt("i8_neg"), -5);
  EXPECT_EQ(*f_->GetInt("i64_neg"), -(1ll << 40));
  EXPECT_EQ(*f_->GetInt("u8"), 200);
  ExpectInvalid(f_->GetInt("u64_big").status(), {"'u64_big'", "9223372036854775813", "int64"});
  ExpectInvalid(f_->GetInt("flag").status(), {"'flag'", "bool", "integer"});
}

TEST_F(GgufGetters, FloatRejectsIntegers) {
  EXPECT_EQ(*f_->GetFloat("qwen35.rope.freq_base"), 1e7);
  EXPECT_EQ(*f_->GetFloat("f64"), 0.125);
  ExpectInvalid(f_->GetFloat("qwen35.embedding_length").status(),
                {"'qwen35.embedding_length'", "type u32", "expected f32 or f64"});
  ExpectInvalid(f_->GetFloat("i32_pos").status(), {"i32"});
}

TEST_F(GgufGetters, BoolStringAndTypeMismatch) {
  EXPECT_EQ(*f_->GetBool("flag"), false);
  EXPECT_EQ(*f_->GetString("name"), "model");
  ExpectInvalid(f_->GetBool("u8").status(), {"'u8'", "u8", "bool"});
  ExpectInvalid(f_->GetString("tokens").status(),
                {"'tokens'", "array of string", "expected string"});
}

TEST_F(GgufGetters, Arrays) {
  EXPECT_EQ(*f_->GetStringArray("tokens"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(*f_->GetIntArray("sections"), (std::vector<int64_t>{11, 11, 10, 0}));
  EXPECT_EQ(*f_->GetFloatArray("f32s"), (std::vector<float>{0.5f, 2.0f}));
  EXPECT_EQ(*f_->GetFloatArray("f64s"), (std::vector<float>{0.25f}));
  ExpectInvalid(f_->GetIntArray("u64s").status(), {"'u64s'", "element 1", "int64"});
  ExpectInvalid(f_->GetIntArray("tokens").status(), {"'tokens'", "array of string", "integers"});
  ExpectInvalid(f_->GetIntArray("u8").status(), {"'u8'", "u8", "array"});
  ExpectInvalid(f_->GetFloatArray("sections").status(), {"'sections'", "array of i32"});
  ExpectInvalid(f_->GetStringArray("nested").status(), {"'nested'", "array of array"});
}

TEST_F(GgufGetters, MissingKeysAndTensors) {
  auto s = f_->GetUInt("qwen35.block_count").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "missing GGUF key 'qwen35.block_count'");
  EXPECT_EQ(f_->GetFloat("x").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(f_->GetString("x").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(f_->GetStringArray("x").status().code(), absl::StatusCode::kNotFound);
  auto t = f_->GetTensor("blk.0.attn_qkv.weight").status();
  EXPECT_EQ(t.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(t.message(), "missing tensor 'blk.0.attn_qkv.weight'");
  EXPECT_EQ(f_->FindTensor("blk.0.attn_qkv.weight"), nullptr);
  EXPECT_NE(f_->FindTensor("blk.0.attn_norm.weight"), nullptr);
}

TEST_F(GgufGetters, Defaults) {
  EXPECT_EQ(*f_->GetUIntOr("qwen35.nextn_predict_layers", 0), 0u);
  EXPECT_EQ(*f_->GetUIntOr("qwen35.embedding_length", 1), 5120u);
  ExpectInvalid(f_->GetUIntOr("name", 3).status(), {"'name'"});
  EXPECT_EQ(*f_->GetFloatOr("absent", 1e-6), 1e-6);
  ExpectInvalid(f_->GetFloatOr("u8", 1.0).status(), {"'u8'"});
}

// ---- writer validation --------------------------------------------------------------------------

void ExpectWriteError(const Writer& w, std::vector<std::string> needles) {
  auto img = w.WriteToMemory();
  ASSERT_FALSE(img.ok());
  ExpectInvalid(img.status(), needles);
}

TEST(GgufWriter, RejectsInvalidInput) {
  {
    Writer w;
    w.AddU32("a", 1);
    w.AddU32("a", 2);
    ExpectWriteError(w, {"duplicate GGUF key 'a'"});
  }
  {
    Writer w;
    w.AddU32("", 1);
    ExpectWriteError(w, {"empty key"});
  }
  {
    Writer w;
    w.AddTensor("t", {4}, GgmlType::F32, PatternFill(0));
    w.AddTensor("t", {4}, GgmlType::F32, PatternFill(0));
    ExpectWriteError(w, {"duplicate tensor name 't'"});
  }
  {
    Writer w;
    w.AddTensor("t", {}, GgmlType::F32, PatternFill(0));
    ExpectWriteError(w, {"'t'", "n_dims 0"});
  }
  {
    Writer w;
    w.AddTensor("t", {1, 1, 1, 1, 1}, GgmlType::F32, PatternFill(0));
    ExpectWriteError(w, {"'t'", "n_dims 5"});
  }
  {
    Writer w;
    w.AddTensor("t", {4, -1}, GgmlType::F32, PatternFill(0));
    ExpectWriteError(w, {"'t'", "ne[1] = -1"});
  }
  {
    Writer w;
    w.AddTensor("t", {33}, GgmlType::Q8_0, PatternFill(0));
    ExpectWriteError(w, {"'t'", "not a multiple of the Q8_0 block size 32"});
  }
  {
    Writer w;
    w.AddTensor("t", {1ll << 32, 1ll << 32}, GgmlType::F32, PatternFill(0));
    ExpectWriteError(w, {"'t'", "overflow"});
  }
  {
    Writer w;
    w.AddTensor("t", {4}, static_cast<GgmlType>(99), PatternFill(0));
    ExpectWriteError(w, {"'t'", "unknown ggml type id 99"});
  }
  {
    Writer w;
    w.AddTensorBytes("t", {4}, GgmlType::F32, std::vector<uint8_t>(15));
    ExpectWriteError(w, {"'t'", "15 bytes supplied", "needs 16"});
  }
  {
    Writer w;
    w.AddTensor(std::string(kMaxTensorNameBytes + 1, 'x'), {4}, GgmlType::F32, PatternFill(0));
    ExpectWriteError(w, {"257 bytes"});
  }
  {
    Writer w;
    w.AddTensor("t", {4}, GgmlType::F32, nullptr);
    ExpectWriteError(w, {"'t'", "no fill callback"});
  }
  {
    Writer w;
    w.SetAlignment(48);
    ExpectWriteError(w, {"48", "power of two"});
  }
  {
    Writer w;
    w.AddU32("general.alignment", 64);  // disagrees with the writer's 32
    ExpectWriteError(w, {"general.alignment", "32"});
  }
  {
    Writer w;
    w.AddValue("v", UV(ValueType::U8, 300));
    ExpectWriteError(w, {"'v'", "300", "u8"});
  }
  {
    Writer w;
    w.AddValue("v", SV(ValueType::I16, -40000));
    ExpectWriteError(w, {"'v'", "-40000", "i16"});
  }
  {
    Writer w;
    w.AddValue("v", Value{ValueType::STRING, uint64_t{1}});
    ExpectWriteError(w, {"'v'", "string"});
  }
  {
    Writer w;
    w.AddValue("v", Value{ValueType::ARRAY, Array{ValueType::U32, {StrV("x")}}});
    ExpectWriteError(w, {"'v'", "element 0", "string", "u32"});
  }
  {
    Value v = ArrV(ValueType::U8, {});
    for (int d = 0; d < kMaxArrayDepth; ++d) v = ArrV(ValueType::ARRAY, {v});
    Writer w;
    w.AddValue("deep", v);
    ExpectWriteError(w, {"'deep'", "nested"});
  }
}

TEST(GgufWriter, WriteFileErrorsNamePathAndLeaveNothing) {
  Writer w;
  w.AddU32("a", 1);
  const std::string path = "/nonexistent_dir_for_gguf_test/x.gguf";
  absl::Status s = w.WriteFile(path);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(path), std::string::npos) << s;

  Writer bad;
  bad.SetAlignment(3);
  const std::string p2 = ::testing::TempDir() + "/gguf_bad_" + std::to_string(getpid()) + ".gguf";
  s = bad.WriteFile(p2);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(p2), std::string::npos) << s;
  EXPECT_NE(access(p2.c_str(), F_OK), 0);
}

TEST(GgufOpen, ErrorsNamePath) {
  const std::string missing = ::testing::TempDir() + "/definitely_missing.gguf";
  auto f = File::Open(missing);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(f.status().message().find(missing), std::string::npos) << f.status();

  const std::string bad =
      ::testing::TempDir() + "/gguf_badmagic_" + std::to_string(getpid()) + ".gguf";
  {
    std::ofstream out(bad, std::ios::binary);
    out << "GGUX and some more bytes to make it long enough";
  }
  f = File::Open(bad);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().message().rfind(bad + ": ", 0), 0u) << f.status();
  EXPECT_NE(f.status().message().find("bad magic"), std::string::npos);

  { std::ofstream out(bad, std::ios::binary | std::ios::trunc); }
  f = File::Open(bad);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find(bad), std::string::npos);
  unlink(bad.c_str());

  f = File::Open(::testing::TempDir());
  ASSERT_FALSE(f.ok());
}

}  // namespace
}  // namespace ds::gguf
