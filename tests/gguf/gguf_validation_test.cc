// Reader validation: each rule is exercised by a hand-built or corrupted image, and every error
// must be a clean InvalidArgument naming the key/tensor (never a crash or a huge allocation).
#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "common/gguf/gguf.h"
#include "tests/gguf/raw_gguf.h"

namespace ds::gguf {
namespace {

using ::ds::gguf::testing::ExactBuffer;
using ::ds::gguf::testing::RawGguf;

constexpr uint32_t kF32 = 0, kQ4_0 = 2, kQ8_0 = 8;
constexpr uint32_t kTypeU32 = 4, kTypeString = 8, kTypeArray = 9, kTypeU64 = 10;

absl::Status ParseStatus(const std::vector<uint8_t>& img, size_t n) {
  ExactBuffer buf(img, n);
  auto f = File::Parse(buf.data.get(), buf.size);
  return f.status();
}
absl::Status ParseStatus(const std::vector<uint8_t>& img) { return ParseStatus(img, img.size()); }

void ExpectError(const std::vector<uint8_t>& img, std::vector<std::string> needles) {
  absl::Status s = ParseStatus(img);
  ASSERT_FALSE(s.ok()) << "expected failure containing " << needles[0];
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  for (const auto& n : needles) {
    EXPECT_NE(s.message().find(n), std::string::npos)
        << "message: " << s.message() << "\nmissing: " << n;
  }
}

// Valid image: 2 keys, tensors t0 {8} F32 at 0 (32 bytes) and t1 {32,2} Q8_0 at 32 (68 bytes).
struct Base {
  uint32_t version = 3;
  uint64_t n_tensors = 2, n_kv = 2;
  uint32_t t1_type = kQ8_0;
  uint64_t t1_ne0 = 32, t1_offset = 32;
  std::string t1_name = "t1";
  std::vector<uint8_t> Build() const {
    RawGguf r;
    r.Header(n_tensors, n_kv, version);
    r.KvStr("general.architecture", "qwen35");
    r.KvU32("a.u32", 7);
    r.TensorInfo("t0", {8}, kF32, 0);
    r.TensorInfo(t1_name, {t1_ne0, 2}, t1_type, t1_offset);
    r.PadTo(32);
    r.Fill(32 + 68);
    return r.bytes();
  }
};

// Header + one key holding `payload` (type tag included by the caller).
std::vector<uint8_t> OneKey(const std::function<void(RawGguf&)>& payload) {
  RawGguf r;
  r.Header(0, 1);
  payload(r);
  return r.bytes();
}

std::vector<uint8_t> OneTensor(const std::function<void(RawGguf&)>& info, size_t data = 64) {
  RawGguf r;
  r.Header(1, 0);
  info(r);
  r.PadTo(32);
  r.Fill(data);
  return r.bytes();
}

TEST(GgufValidation, BaseImageIsValid) {
  const auto img = Base().Build();
  ExactBuffer buf(img);
  auto f = File::Parse(buf.data.get(), buf.size);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->tensors().size(), 2u);
  EXPECT_EQ((*f)->tensors()[1].nbytes, 68u);
  EXPECT_EQ(*(*f)->GetString("general.architecture"), "qwen35");
}

TEST(GgufValidation, EveryTruncationFails) {
  for (const auto& img : {Base().Build(), OneKey([](RawGguf& r) {
                            r.Key("nested", kTypeArray).U32(kTypeArray).U64(2);
                            r.U32(kTypeString).U64(1).Str("abc");
                            r.U32(kTypeU32).U64(2).U32(1).U32(2);
                          })}) {
    ASSERT_TRUE(ParseStatus(img).ok());
    for (size_t n = 0; n < img.size(); ++n) {
      absl::Status s = ParseStatus(img, n);
      ASSERT_FALSE(s.ok()) << "prefix of " << n << " bytes parsed";
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_FALSE(s.message().empty());
    }
  }
  absl::Status s = File::Parse(nullptr, 0).status();
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s;
}

TEST(GgufValidation, TruncationMessagesSayWhere) {
  const auto img = Base().Build();
  absl::Status s = ParseStatus(img, 10);
  EXPECT_NE(s.message().find("truncated GGUF: header tensor count"), std::string::npos) << s;
  // Inside the second key's value.
  const size_t second_key_value = 24 + (8 + 20 + 4 + 8 + 6) + (8 + 5 + 4);
  s = ParseStatus(img, second_key_value + 2);
  EXPECT_NE(s.message().find("GGUF key 'a.u32': truncated GGUF: u32 value"), std::string::npos)
      << s;
  // Data section cut short.
  s = ParseStatus(img, img.size() - 1);
  EXPECT_NE(s.message().find("tensor 't1'"), std::string::npos) << s;
  EXPECT_NE(s.message().find("outside the file"), std::string::npos) << s;
}

TEST(GgufValidation, MagicAndVersion) {
  auto img = Base().Build();
  img[0] ^= 0x20;
  ExpectError(img, {"bad magic"});
  Base b;
  b.version = 1;
  ExpectError(b.Build(), {"unsupported GGUF version 1"});
  b.version = 4;
  ExpectError(b.Build(), {"unsupported GGUF version 4"});
  b.version = 0x03000000;
  ExpectError(b.Build(), {"big-endian"});
  b.version = 2;
  ExactBuffer buf(b.Build());
  auto f = File::Parse(buf.data.get(), buf.size);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->version(), 2u);
}

TEST(GgufValidation, ImpossibleCountsAreRejectedBeforeAllocating) {
  Base b;
  b.n_kv = 1ull << 60;
  ExpectError(b.Build(), {"metadata count 1152921504606846976 cannot fit"});
  b = Base();
  b.n_tensors = ~0ull;
  ExpectError(b.Build(), {"tensor count", "cannot fit"});
  // 2^60 u32 elements: would be 2^60 Values if allocated.
  ExpectError(
      OneKey([](RawGguf& r) { r.Key("arr", kTypeArray).U32(kTypeU32).U64(1ull << 60).U32(1); }),
      {"GGUF key 'arr'", "array of 1152921504606846976 u32 elements cannot fit"});
  // Count whose byte size would overflow 64 bits.
  ExpectError(OneKey([](RawGguf& r) { r.Key("arr", kTypeArray).U32(kTypeU64).U64(~0ull >> 1); }),
              {"GGUF key 'arr'", "cannot fit"});
  ExpectError(OneKey([](RawGguf& r) {
                r.Key("arr", kTypeArray).U32(kTypeString).U64(1ull << 62).Str("x");
              }),
              {"GGUF key 'arr'", "string elements cannot fit"});
  // Nested: the inner count is checked against what is left.
  ExpectError(OneKey([](RawGguf& r) {
                r.Key("arr", kTypeArray).U32(kTypeArray).U64(1).U32(kTypeU32).U64(1ull << 40);
              }),
              {"GGUF key 'arr'", "array element 0", "cannot fit"});
}

TEST(GgufValidation, StringLengths) {
  ExpectError(OneKey([](RawGguf& r) { r.Key("s", kTypeString).U64(1ull << 62).U32(0); }),
              {"GGUF key 's'", "string value length 4611686018427387904 exceeds"});
  ExpectError(OneKey([](RawGguf& r) { r.U64(~0ull).U32(0).U64(0); }),
              {"metadata entry #0 key length"});
  ExpectError(
      OneKey([](RawGguf& r) { r.Str(std::string(kMaxKeyBytes + 1, 'k')).U32(kTypeU32).U32(1); }),
      {"metadata entry #0 key length 65536 exceeds the limit"});
  ExpectError(OneKey([](RawGguf& r) { r.Key("", kTypeU32).U32(1); }), {"empty key"});
  ExpectError(OneKey([](RawGguf& r) {
                r.Key("arr", kTypeArray).U32(kTypeString).U64(2).Str("ok").U64(100).Put("abc", 3);
              }),
              {"GGUF key 'arr'", "array element 1", "string value length 100"});
}

TEST(GgufValidation, UnknownValueTypes) {
  ExpectError(OneKey([](RawGguf& r) { r.Key("k", 13).U32(0); }),
              {"GGUF key 'k'", "unknown value type 13"});
  ExpectError(OneKey([](RawGguf& r) { r.Key("k", kTypeArray).U32(99).U64(0); }),
              {"GGUF key 'k'", "unknown array element type 99"});
  ExpectError(OneKey([](RawGguf& r) { r.Key("flag", 7).U8(2); }),
              {"GGUF key 'flag'", "bool value 2"});
}

std::vector<uint8_t> Nested(int depth) {
  return OneKey([depth](RawGguf& r) {
    r.Key("deep", kTypeArray);
    for (int d = 1; d < depth; ++d) r.U32(kTypeArray).U64(1);
    r.U32(kTypeU32).U64(1).U32(42);
  });
}

TEST(GgufValidation, NestingDepth) {
  EXPECT_TRUE(ParseStatus(Nested(kMaxArrayDepth)).ok());
  ExpectError(Nested(kMaxArrayDepth + 1), {"GGUF key 'deep'", "nested more than 8"});
  ExpectError(Nested(100000), {"GGUF key 'deep'", "nested"});
}

TEST(GgufValidation, DuplicateNames) {
  RawGguf r;
  r.Header(0, 2).KvU32("a", 1).KvU32("a", 2);
  ExpectError(r.bytes(), {"duplicate GGUF key 'a'"});
  Base b;
  b.t1_name = "t0";
  ExpectError(b.Build(), {"duplicate tensor name 't0'"});
}

TEST(GgufValidation, TensorNames) {
  auto named = [](size_t len) {
    return OneTensor([len](RawGguf& r) { r.TensorInfo(std::string(len, 'w'), {4}, kF32, 0); });
  };
  EXPECT_TRUE(ParseStatus(named(65)).ok());
  EXPECT_TRUE(ParseStatus(named(kMaxTensorNameBytes)).ok());
  ExpectError(named(kMaxTensorNameBytes + 1), {"tensor #0 name length 257 exceeds"});
  ExpectError(named(0), {"tensor #0 has an empty name"});
}

TEST(GgufValidation, Shapes) {
  auto dims = [](std::vector<uint64_t> ne, uint32_t type = kF32) {
    return OneTensor([=](RawGguf& r) { r.TensorInfo("w", ne, type, 0); });
  };
  ExpectError(dims({}), {"tensor 'w'", "n_dims 0 not in 1..4"});
  ExpectError(dims({1, 1, 1, 1, 1}), {"tensor 'w'", "n_dims 5"});
  ExpectError(dims({4, 0}), {"tensor 'w'", "ne[1] is 0"});
  ExpectError(dims({4, ~0ull}), {"tensor 'w'", "ne[1] is negative (-1)"});
  ExpectError(dims({1ull << 32, 1ull << 32}), {"tensor 'w'", "element count overflows"});
  ExpectError(dims({1ull << 40, 1ull << 20, 1ull << 3}), {"tensor 'w'", "element count overflows"});
  ExpectError(dims({1ull << 62}), {"tensor 'w'", "byte size overflows"});
  ExpectError(dims({33}, kQ8_0),
              {"tensor 'w'", "ne[0] = 33 is not a multiple of the Q8_0 block size 32"});
  ExpectError(dims({256}, 99), {"tensor 'w'", "unknown ggml type id 99"});
  ExpectError(dims({256}, 4), {"tensor 'w'", "unknown ggml type id 4"});
  EXPECT_TRUE(ParseStatus(dims({4, 2, 1, 1})).ok());
}

TEST(GgufValidation, KnownButUnsupportedTypeParses) {
  Base b;
  b.t1_type = kQ4_0;  // 32 elems -> 18 bytes/row, 36 bytes total (fits in the 68-byte slot)
  ExactBuffer buf(b.Build());
  auto f = File::Parse(buf.data.get(), buf.size);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->tensors()[1].type, GgmlType::Q4_0);
  EXPECT_FALSE(GgmlInfo((*f)->tensors()[1].type).supported);
  EXPECT_EQ((*f)->tensors()[1].nbytes, 36u);
}

TEST(GgufValidation, OffsetsAndDataRange) {
  Base b;
  b.t1_offset = 48;
  ExpectError(b.Build(), {"tensor 't1'", "data offset 48 is not a multiple of the alignment 32"});
  b.t1_offset = 4096;
  ExpectError(b.Build(), {"tensor 't1'", "outside the file"});
  b.t1_offset = ~0ull & ~31ull;  // begin overflows 64 bits
  ExpectError(b.Build(), {"tensor 't1'", "outside the file"});
  b.t1_offset = 0;
  ExpectError(b.Build(), {"tensors 't0'", "'t1'", "overlap"});
  // Sorted-order check: t1 first in the data section, t0 overlapping its tail.
  RawGguf r;
  r.Header(2, 0).TensorInfo("t0", {8}, kF32, 64).TensorInfo("t1", {32, 2}, kQ8_0, 0);
  r.PadTo(32).Fill(200);
  ExpectError(r.bytes(), {"tensors 't1'", "'t0'", "overlap"});
  // Out-of-order but disjoint is fine.
  RawGguf ok;
  ok.Header(2, 0).TensorInfo("t0", {8}, kF32, 96).TensorInfo("t1", {32, 2}, kQ8_0, 0);
  ok.PadTo(32).Fill(128);
  EXPECT_TRUE(ParseStatus(ok.bytes()).ok()) << ParseStatus(ok.bytes());
}

std::vector<uint8_t> WithAlignmentKey(const std::function<void(RawGguf&)>& kv, uint64_t offset) {
  RawGguf r;
  r.Header(1, 1);
  kv(r);
  r.TensorInfo("w", {16}, kF32, offset);
  r.PadTo(64).Fill(128 + 64);
  return r.bytes();
}

TEST(GgufValidation, Alignment) {
  ExpectError(WithAlignmentKey([](RawGguf& r) { r.KvU32("general.alignment", 48); }, 0),
              {"'general.alignment'", "48 is not a power of two"});
  ExpectError(WithAlignmentKey([](RawGguf& r) { r.KvU32("general.alignment", 0); }, 0),
              {"'general.alignment'", "0 is not a power of two"});
  ExpectError(WithAlignmentKey([](RawGguf& r) { r.Key("general.alignment", kTypeU64).U64(64); }, 0),
              {"'general.alignment'", "type u64, expected u32"});
  ExpectError(WithAlignmentKey([](RawGguf& r) { r.KvStr("general.alignment", "64"); }, 0),
              {"'general.alignment'", "type string"});
  ExpectError(WithAlignmentKey([](RawGguf& r) { r.KvU32("general.alignment", 64); }, 32),
              {"tensor 'w'", "data offset 32 is not a multiple of the alignment 64"});
  const auto good = WithAlignmentKey([](RawGguf& r) { r.KvU32("general.alignment", 64); }, 64);
  ExactBuffer buf(good);
  auto f = File::Parse(buf.data.get(), buf.size);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->alignment(), 64u);
  // Data section starts at the first 64-byte boundary after the infos.
  EXPECT_EQ(((*f)->tensors()[0].data - (*f)->base()) % 64, 0);
}

TEST(GgufValidation, SingleByteCorruptionsNeverCrash) {
  // Flip every byte of a valid image to a few values; the parser must return (ok or not) without
  // tripping ASan/UBSan, and accepted results must be internally consistent.
  const auto img = Base().Build();
  for (size_t i = 0; i < img.size(); ++i) {
    for (uint8_t v : {uint8_t{0x00}, uint8_t{0xFF}, uint8_t{0x80}, uint8_t{0x41}}) {
      auto copy = img;
      copy[i] = v;
      ExactBuffer buf(copy);
      auto f = File::Parse(buf.data.get(), buf.size);
      if (!f.ok()) {
        EXPECT_FALSE(f.status().message().empty());
        continue;
      }
      for (const TensorInfo& t : (*f)->tensors()) {
        ASSERT_GE(t.data, buf.data.get());
        ASSERT_LE(t.data + t.nbytes, buf.data.get() + buf.size);
      }
    }
  }
}

}  // namespace
}  // namespace ds::gguf
