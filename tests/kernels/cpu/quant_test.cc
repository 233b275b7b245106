// Tests of the CPU GGUF weight-format reference (kernels/cpu/quant.h): exact decoding of hand-built
// blocks against the spec/model.md §10 formulas (written again here on raw bytes), DotRow against
// DequantizeRow, quantize/dequantize error bounds, and edge cases.
#include "kernels/cpu/quant.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/util/half.h"
#include "kernels/cpu/dot_tokens.h"

namespace ds::cpu {
namespace {

constexpr GgmlType kAllSupported[] = {GgmlType::F32,  GgmlType::F16,    GgmlType::BF16,
                                      GgmlType::Q8_0, GgmlType::Q4_K,   GgmlType::Q5_K,
                                      GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS};
constexpr GgmlType kBlockTypes[] = {GgmlType::Q8_0, GgmlType::Q4_K,   GgmlType::Q5_K,
                                    GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS};

std::string TypeName(const ::testing::TestParamInfo<GgmlType>& info) {
  return std::string(GgmlInfo(info.param).name);
}

int BlockElems(GgmlType t) { return GgmlInfo(t).block_elems; }
int BlockBytes(GgmlType t) { return GgmlInfo(t).block_bytes; }

uint16_t Rd16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
void Wr16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v & 0xff);
  p[1] = static_cast<uint8_t>(v >> 8);
}
float Fp16At(const uint8_t* p) { return F16ToF32(Rd16(p)); }

constexpr int kK[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// ---- Spec §10 element formulas on raw block bytes (byte offsets from the layout lines). ----

// 6-bit (sc, mn) of sub-block j from the 12 packed scale bytes.
void SpecScaleMin(const uint8_t* s, int j, int* sc, int* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

double SpecElem(GgmlType t, const uint8_t* b, int e) {
  switch (t) {
    case GgmlType::Q8_0:  // d @0, qs @2
      return static_cast<double>(Fp16At(b)) * static_cast<int8_t>(b[2 + e]);
    case GgmlType::Q4_K:
    case GgmlType::Q5_K: {  // d @0, dmin @2, scales @4; Q4_K qs @16; Q5_K qh @16, qs @48
      const bool q5 = t == GgmlType::Q5_K;
      const uint8_t* qs = b + (q5 ? 48 : 16);
      const uint8_t* qh = b + 16;
      const int c = e / 64, r = e % 64, l = r % 32, upper = r / 32;
      const int j = 2 * c + upper;
      int q = upper ? (qs[32 * c + l] >> 4) : (qs[32 * c + l] & 0x0F);
      if (q5) q += 16 * ((qh[l] >> j) & 1);
      int sc, mn;
      SpecScaleMin(b + 4, j, &sc, &mn);
      return static_cast<double>(Fp16At(b)) * sc * q - static_cast<double>(Fp16At(b + 2)) * mn;
    }
    case GgmlType::Q6_K: {  // ql @0, qh @128, scales @192, d @208
      const uint8_t* ql = b;
      const uint8_t* qh = b + 128;
      const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
      const int n = e / 128, r = e % 128, k = r / 32, l = r % 32, s = 8 * n + l / 16;
      const int ql_byte = ql[64 * n + l + (k % 2 == 1 ? 32 : 0)];
      const int low = k < 2 ? (ql_byte & 0x0F) : (ql_byte >> 4);
      const int high = (qh[32 * n + l] >> (2 * k)) & 3;
      const int q = (low | (high << 4)) - 32;
      return static_cast<double>(Fp16At(b + 208)) * scales[s + 2 * k] * q;
    }
    case GgmlType::IQ4_NL: {  // d @0, qs @2
      const int j = e % 16;
      const int nib = e < 16 ? (b[2 + j] & 0x0F) : (b[2 + j] >> 4);
      return static_cast<double>(Fp16At(b)) * kK[nib];
    }
    case GgmlType::IQ4_XS: {  // d @0, scales_h @2, scales_l @4, qs @8
      const int sb = e / 32, j = e % 32 % 16;
      const uint16_t scales_h = Rd16(b + 2);
      const int ls =
          ((b[4 + sb / 2] >> (4 * (sb % 2))) & 0x0F) | (((scales_h >> (2 * sb)) & 3) << 4);
      const uint8_t byte = b[8 + 16 * sb + j];
      const int nib = e % 32 < 16 ? (byte & 0x0F) : (byte >> 4);
      return static_cast<double>(Fp16At(b)) * (ls - 32) * kK[nib];
    }
    case GgmlType::F32: {
      float f;
      std::memcpy(&f, b, 4);
      return f;
    }
    case GgmlType::F16:
      return F16ToF32(Rd16(b));
    case GgmlType::BF16: {
      const uint32_t bits = static_cast<uint32_t>(Rd16(b)) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    default:
      ADD_FAILURE() << "no spec formula";
      return 0;
  }
}

// Byte offsets of the fp16 scale fields of a block (to be overwritten with sane values).
std::vector<int> Fp16Offsets(GgmlType t) {
  switch (t) {
    case GgmlType::Q8_0:
    case GgmlType::IQ4_NL:
    case GgmlType::IQ4_XS:
      return {0};
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
      return {0, 2};
    case GgmlType::Q6_K:
      return {208};
    default:
      return {};
  }
}

// A row of n_blocks random blocks: random payload bytes, fp16 scales set to `scale_of(rng)` (or
// random finite values for the scalar types).
template <class ScaleFn>
std::vector<uint8_t> RandomRow(GgmlType t, int n_blocks, std::mt19937& rng, ScaleFn scale_of) {
  std::vector<uint8_t> row(static_cast<size_t>(n_blocks) * BlockBytes(t));
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& v : row) v = static_cast<uint8_t>(byte(rng));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int i = 0; i < n_blocks; ++i) {
    uint8_t* b = row.data() + static_cast<size_t>(i) * BlockBytes(t);
    if (t == GgmlType::F32) {
      const float f = normal(rng);
      std::memcpy(b, &f, 4);
    } else if (t == GgmlType::F16) {
      Wr16(b, F32ToF16(normal(rng)));
    } else if (t == GgmlType::BF16) {
      Wr16(b, F32ToBf16(normal(rng)));
    }
    for (int off : Fp16Offsets(t)) Wr16(b + off, scale_of(rng));
  }
  return row;
}

// Random power-of-two fp16 scales: every decoded value is then exact in float.
uint16_t PowerOfTwoScale(std::mt19937& rng) {
  const int e = std::uniform_int_distribution<int>(-8, 2)(rng);
  const float sign = std::uniform_int_distribution<int>(0, 1)(rng) ? 1.0f : -1.0f;
  return F32ToF16(sign * std::ldexp(1.0f, e));
}
uint16_t GenericScale(std::mt19937& rng) {
  return F32ToF16(std::uniform_real_distribution<float>(-0.05f, 0.05f)(rng));
}

class QuantTypeTest : public ::testing::TestWithParam<GgmlType> {};
INSTANTIATE_TEST_SUITE_P(AllTypes, QuantTypeTest, ::testing::ValuesIn(kAllSupported), TypeName);

class BlockTypeTest : public ::testing::TestWithParam<GgmlType> {};
INSTANTIATE_TEST_SUITE_P(BlockTypes, BlockTypeTest, ::testing::ValuesIn(kBlockTypes), TypeName);

// ---- (1) exact decoding ------------------------------------------------------------------------

TEST_P(QuantTypeTest, DequantMatchesSpecFormulaExactly) {
  const GgmlType t = GetParam();
  ASSERT_TRUE(QuantTypeSupported(t));
  std::mt19937 rng(1234);
  const int n_blocks = t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16 ? 300 : 3;
  const std::vector<uint8_t> row = RandomRow(t, n_blocks, rng, PowerOfTwoScale);
  const int64_t n = static_cast<int64_t>(n_blocks) * BlockElems(t);
  std::vector<float> y(n);
  DequantizeRow(t, row.data(), y.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* b = row.data() + (i / BlockElems(t)) * BlockBytes(t);
    const double expect = SpecElem(t, b, static_cast<int>(i % BlockElems(t)));
    ASSERT_EQ(static_cast<double>(y[i]), expect) << "element " << i;
  }
}

TEST(QuantExact, Q8_0HandBuilt) {
  uint8_t b[34] = {};
  Wr16(b, 0x3400);  // d = 0.25
  b[2 + 5] = static_cast<uint8_t>(-7);
  b[2 + 31] = 127;
  b[2 + 0] = static_cast<uint8_t>(-128);
  float y[32];
  DequantizeRow(GgmlType::Q8_0, b, y, 32);
  EXPECT_EQ(y[5], -1.75f);
  EXPECT_EQ(y[31], 31.75f);
  EXPECT_EQ(y[0], -32.0f);
  EXPECT_EQ(y[1], 0.0f);
}

// Q4_K / Q5_K sub-block 5 (group c = 2, upper half): sc = (scales[9] & 15) | (scales[1] >> 6) << 4,
// mn = (scales[9] >> 4) | (scales[5] >> 6) << 4.
void FillKScales(uint8_t* b) {
  Wr16(b, 0x3c00);      // d = 1
  Wr16(b + 2, 0x3800);  // dmin = 0.5
  b[4 + 9] = 0x37;      // sc5 low nibble 7, mn5 low nibble 3
  b[4 + 1] = 0x40;      // sc5 high bits 1 -> sc5 = 23 (sc1 = 0)
  b[4 + 5] = 0x80;      // mn5 high bits 2 -> mn5 = 35 (mn1 = 0)
  b[4 + 0] = 0x02;      // sc0 = 2, mn0 = 0
}

TEST(QuantExact, Q4KHandBuilt) {
  uint8_t b[144] = {};
  FillKScales(b);
  b[16 + 67] = 0xB4;  // element 163 (= 64*2 + 32 + 3): q = 11; element 131: q = 4 with sub-block 4
  b[16 + 1] = 0x09;   // element 1: q = 9 in sub-block 0
  float y[256];
  DequantizeRow(GgmlType::Q4_K, b, y, 256);
  EXPECT_EQ(y[163], 23.0f * 11 - 0.5f * 35);  // 235.5
  EXPECT_EQ(y[160], -17.5f);                  // q = 0: just -dmin*mn
  EXPECT_EQ(y[131], 0.0f);                    // sub-block 4: sc = mn = 0
  EXPECT_EQ(y[1], 18.0f);                     // 1 * 2 * 9
  EXPECT_EQ(y[33], 0.0f);                     // sub-block 1: sc = mn = 0
}

TEST(QuantExact, Q5KHandBuilt) {
  uint8_t b[176] = {};
  FillKScales(b);
  b[48 + 67] = 0xB0;  // element 163: low 4 bits of q = 11
  b[16 + 3] = 0x20;   // qh[3] bit 5 (= 2c + 1 for c = 2): +16 -> q = 27
  b[16 + 1] = 0x01;   // qh[1] bit 0: element 1 (sub-block 0) gets q = 16
  float y[256];
  DequantizeRow(GgmlType::Q5_K, b, y, 256);
  EXPECT_EQ(y[163], 23.0f * 27 - 0.5f * 35);  // 603.5
  EXPECT_EQ(y[131], 0.0f);                    // same qh byte, bit 4 clear, sc = 0
  EXPECT_EQ(y[1], 32.0f);                     // 1 * 2 * 16
  EXPECT_EQ(y[2], 0.0f);
}

TEST(QuantExact, Q6KHandBuilt) {
  uint8_t b[210] = {};
  Wr16(b + 208, 0x3800);  // d = 0.5 (stored last)
  // Element 244 = 128*1 + 20 + 96: ql high nibble of byte 64+20+32 = 116, qh[32+20] bits 6..7,
  // scale scales[8 + 20/16 + 6] = scales[15].
  b[192 + 15] = 3;
  b[116] = 0xA0;       // high nibble 10
  b[128 + 52] = 0x80;  // bits 6..7 = 2 -> q = (10 | 2 << 4) - 32 = 10
  // Element 5 = 128*0 + 5: ql[5] low nibble, qh[5] bits 0..1, scale scales[0].
  b[192 + 0] = static_cast<int8_t>(-2);
  b[5] = 0x07;
  b[128 + 5] = 0x03;  // q = (7 | 3 << 4) - 32 = 23
  float y[256];
  DequantizeRow(GgmlType::Q6_K, b, y, 256);
  EXPECT_EQ(y[244], 15.0f);   // 0.5 * 3 * 10
  EXPECT_EQ(y[245], -48.0f);  // zero bits decode to q = -32: 0.5 * 3 * -32
  EXPECT_EQ(y[180], 0.0f);    // low nibble of byte 116 belongs to element 180, scale 11 = 0
  EXPECT_EQ(y[5], -23.0f);    // 0.5 * -2 * 23
  EXPECT_EQ(y[4], 32.0f);     // 0.5 * -2 * -32
}

TEST(QuantExact, Iq4NlHandBuilt) {
  uint8_t b[18] = {};
  Wr16(b, 0x3800);  // d = 0.5
  b[2 + 3] = 0x2F;  // element 3: K[15] = 113, element 19: K[2] = -83
  float y[32];
  DequantizeRow(GgmlType::IQ4_NL, b, y, 32);
  EXPECT_EQ(y[3], 56.5f);
  EXPECT_EQ(y[19], -41.5f);
  EXPECT_EQ(y[0], -63.5f);  // K[0] = -127
}

TEST(QuantExact, Iq4XsHandBuilt) {
  uint8_t b[136] = {};
  Wr16(b, 0x3400);           // d = 0.25
  b[4 + 2] = 0x70;           // sub-block 5 low 4 bits of ls = 7 (sub-block 4: 0)
  Wr16(b + 2, 0x0800);       // scales_h bits 10..11 = 2 -> ls5 = 39, dl = 0.25 * 7 = 1.75
  b[8 + 16 * 5 + 4] = 0x3C;  // element 164: K[12] = 53, element 180: K[3] = -65
  float y[256];
  DequantizeRow(GgmlType::IQ4_XS, b, y, 256);
  EXPECT_EQ(y[164], 1.75f * 53);
  EXPECT_EQ(y[180], 1.75f * -65);
  EXPECT_EQ(y[165], 1.75f * -127);
  EXPECT_EQ(y[128], -8.0f * -127);  // sub-block 4: ls = 0 -> dl = 0.25 * -32
}

TEST(QuantExact, ScalarTypes) {
  const uint8_t f16[4] = {0x00, 0x3c, 0x00, 0xc5};   // 1.0, -5.0
  const uint8_t bf16[4] = {0x80, 0x3f, 0xa0, 0xc0};  // 1.0, -5.0
  float f32[2] = {3.5f, -0.125f};
  float y[2];
  DequantizeRow(GgmlType::F16, f16, y, 2);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -5.0f);
  DequantizeRow(GgmlType::BF16, bf16, y, 2);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -5.0f);
  DequantizeRow(GgmlType::F32, f32, y, 2);
  EXPECT_EQ(y[0], 3.5f);
  EXPECT_EQ(y[1], -0.125f);
}

// ---- (2) DotRow against DequantizeRow --------------------------------------------------------

TEST_P(QuantTypeTest, DotRowMatchesDequantizedDot) {
  const GgmlType t = GetParam();
  std::mt19937 rng(99);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const bool scalar = BlockElems(t) == 1;
  const std::vector<int> block_counts =
      scalar ? std::vector<int>{1, 7, 63, 64, 65, 200, 1000} : std::vector<int>{1, 2, 3, 4};
  for (int nb : block_counts) {
    for (int rep = 0; rep < 5; ++rep) {
      const std::vector<uint8_t> row = RandomRow(t, nb, rng, GenericScale);
      const int64_t n = static_cast<int64_t>(nb) * BlockElems(t);
      // Misaligned copies of both inputs: the kernels must not assume alignment.
      std::vector<uint8_t> row_buf(row.size() + 1);
      std::memcpy(row_buf.data() + 1, row.data(), row.size());
      std::vector<float> x_buf(n + 1);
      float* x = x_buf.data() + 1;
      for (int64_t i = 0; i < n; ++i) x[i] = normal(rng);
      std::vector<float> y(n);
      DequantizeRow(t, row_buf.data() + 1, y.data(), n);
      double ref = 0, mag = 0;
      for (int64_t i = 0; i < n; ++i) {
        ref += static_cast<double>(y[i]) * x[i];
        mag += std::fabs(static_cast<double>(y[i]) * x[i]);
      }
      const float got = DotRow(t, row_buf.data() + 1, x, n);
      ASSERT_NEAR(got, ref, 1e-5 * mag + 1e-30) << "n=" << n << " rep=" << rep;
      // Deterministic: identical bits on a second call and on the aligned copy.
      const float again = DotRow(t, row.data(), x, n);
      ASSERT_EQ(std::memcmp(&got, &again, 4), 0);
    }
  }
}

// The matmul form: each row dequantized once for several tokens, sums four at a time; still
// DotRow's sums bit for bit, for every (row, token), a short tail chunk (scalar formats) and token
// counts that leave a short last group.
TEST_P(QuantTypeTest, DotRowsTokensEqualsDotRowPerRowAndToken) {
  const GgmlType t = GetParam();
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // Scalar formats: 100 elements (64 + a 36-element tail) and 128 (whole chunks: F32 rows are
  // then read in place when the stride allows); padded and packed row strides.
  for (const int nb : BlockElems(t) == 1 ? std::vector<int>{100, 128} : std::vector<int>{3}) {
    const int64_t n = static_cast<int64_t>(nb) * BlockElems(t);
    const size_t row_bytes = GgmlRowBytes(t, n);
    for (const size_t stride : {row_bytes + 2, row_bytes}) {
      const int n_rows = 7;
      std::vector<uint32_t> storage((stride * n_rows + 3) / 4);  // 4-byte aligned
      auto* mat = reinterpret_cast<uint8_t*>(storage.data());
      for (int r = 0; r < n_rows; ++r) {
        const auto row = RandomRow(t, nb, rng, GenericScale);
        std::memcpy(mat + r * stride, row.data(), row_bytes);
      }
      for (int T : {1, 2, 3, 5}) {
        const int64_t ldx = n + 3;
        std::vector<float> x(T * ldx);
        for (auto& v : x) v = normal(rng);
        const int64_t ldo = n_rows + 1;
        std::vector<float> out(T * ldo, -1.0f);
        DotRowsTokens(t, mat, stride, n_rows, x.data(), ldx, T, n, out.data(), ldo);
        for (int tok = 0; tok < T; ++tok)
          for (int r = 0; r < n_rows; ++r) {
            const float one = DotRow(t, mat + r * stride, x.data() + tok * ldx, n);
            EXPECT_EQ(std::memcmp(&one, &out[tok * ldo + r], 4), 0)
                << "n " << n << " stride " << stride << " T " << T << " token " << tok
                << " row " << r << ": " << one << " vs " << out[tok * ldo + r];
          }
      }
    }
  }
}

// F16 / BF16 rows dequantize eight at a time with the hardware conversions: the same value as the
// scalar conversion for every non-NaN bit pattern (subnormals, infinities, signed zeros).
TEST(QuantF16, VectorDequantEqualsScalarForEveryHalf) {
  for (GgmlType t : {GgmlType::F16, GgmlType::BF16}) {
    std::vector<uint16_t> all(65536);
    for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
    std::vector<float> got(65536);
    DequantizeRow(t, all.data(), got.data(), 65536);
    int checked = 0;
    for (uint32_t i = 0; i < 65536; ++i) {
      const float want = t == GgmlType::F16 ? F16ToF32(all[i]) : Bf16ToF32(all[i]);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got[i])) << i;
        continue;
      }
      ASSERT_EQ(std::memcmp(&want, &got[i], 4), 0) << "bits " << i << ": " << want << " vs " << got[i];
      ++checked;
    }
    EXPECT_GT(checked, 60000);
  }
}

// ---- (3) quantize -> dequantize error --------------------------------------------------------

std::vector<float> Normal(int64_t n, uint32_t seed, float mean = 0.0f, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(mean, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

std::vector<float> RoundTrip(GgmlType t, const std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> q(GgmlRowBytes(t, n));
  QuantizeRow(t, x.data(), q.data(), n);
  std::vector<float> y(n);
  DequantizeRow(t, q.data(), y.data(), n);
  return y;
}

double RelRms(const std::vector<float>& x, const std::vector<float>& y) {
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (static_cast<double>(y[i]) - x[i]) * (static_cast<double>(y[i]) - x[i]);
    den += static_cast<double>(x[i]) * x[i];
  }
  return std::sqrt(num / den);
}

bool AllFinite(const std::vector<float>& y) {
  for (float v : y)
    if (!std::isfinite(v)) return false;
  return true;
}

// Measured relative RMS error on N(0,1) rows of 8192 (seed 7), GCC 12 x86-64:
//   F32 0, F16 2.1e-4, BF16 1.64e-3, Q8_0 5.35e-3, Q6_K 1.73e-2, Q5_K 3.57e-2, Q4_K 7.10e-2,
//   IQ4_NL 7.30e-2, IQ4_XS 7.35e-2. Bounds leave a ~10-20% margin.
double ErrorBound(GgmlType t) {
  switch (t) {
    case GgmlType::F32:
      return 0.0;
    case GgmlType::F16:
      return 2.5e-4;
    case GgmlType::BF16:
      return 2.0e-3;
    case GgmlType::Q8_0:
      return 0.0065;
    case GgmlType::Q6_K:
      return 0.020;
    case GgmlType::Q5_K:
      return 0.041;
    case GgmlType::Q4_K:
      return 0.080;
    case GgmlType::IQ4_NL:
      return 0.082;
    case GgmlType::IQ4_XS:
      return 0.083;
    default:
      return 0.0;
  }
}

TEST_P(QuantTypeTest, RoundTripErrorOnNormalData) {
  const GgmlType t = GetParam();
  const auto x = Normal(8192, 7);
  const auto y = RoundTrip(t, x);
  const double err = RelRms(x, y);
  RecordProperty("rel_rms", std::to_string(err));
  std::printf("[ measured ] %s rel RMS error %.5f\n", std::string(GgmlInfo(t).name).c_str(), err);
  EXPECT_LE(err, ErrorBound(t));
  EXPECT_TRUE(AllFinite(y));
  // Scale invariance: the same data scaled by 2^-10 / 2^10 quantizes about as well (the fp16
  // scales stay in their normal range).
  for (float scale : {std::ldexp(1.0f, -10), std::ldexp(1.0f, 10)}) {
    auto xs = x;
    for (auto& v : xs) v *= scale;
    EXPECT_LE(RelRms(xs, RoundTrip(t, xs)), ErrorBound(t) * 1.05) << "scale " << scale;
  }
}

TEST_P(QuantTypeTest, QuantizeIsDeterministic) {
  const GgmlType t = GetParam();
  const auto x = Normal(1024, 11);
  std::vector<uint8_t> a(GgmlRowBytes(t, 1024)), b(a.size(), 0xAA);
  QuantizeRow(t, x.data(), a.data(), 1024);
  QuantizeRow(t, x.data(), b.data(), 1024);
  EXPECT_EQ(a, b);
}

// Values already on a format's grid survive a second quantization bit-exactly for the formats
// whose scale is determined by the block maximum alone.
TEST(QuantRoundTrip, GridValuesAreFixedPoints) {
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0}) {
    const auto x = Normal(512, 3);
    const auto y = RoundTrip(t, x);
    EXPECT_EQ(RoundTrip(t, y), y) << GgmlInfo(t).name;
  }
}

TEST(QuantRoundTrip, HalfFormatsRoundToNearestEven) {
  const auto x = Normal(1000, 17, 0.0f, 100.0f);
  std::vector<uint8_t> h(2000), bh(2000);
  QuantizeRow(GgmlType::F16, x.data(), h.data(), 1000);
  QuantizeRow(GgmlType::BF16, x.data(), bh.data(), 1000);
  for (int i = 0; i < 1000; ++i) {
    ASSERT_EQ(Rd16(h.data() + 2 * i), F32ToF16(x[i]));
    ASSERT_EQ(Rd16(bh.data() + 2 * i), F32ToBf16(x[i]));
  }
  // Finite values beyond the range saturate to the largest finite value instead of inf.
  const float big[4] = {1e6f, -1e6f, FLT_MAX, -FLT_MAX};
  float y[4];
  uint8_t q[8];
  QuantizeRow(GgmlType::F16, big, q, 4);
  DequantizeRow(GgmlType::F16, q, y, 4);
  EXPECT_EQ(y[0], 65504.0f);
  EXPECT_EQ(y[1], -65504.0f);
  EXPECT_EQ(y[3], -65504.0f);
  QuantizeRow(GgmlType::BF16, big, q, 4);
  DequantizeRow(GgmlType::BF16, q, y, 4);
  EXPECT_EQ(y[0], 999424.0f);  // RNE of 1e6 to 8 significant bits
  EXPECT_TRUE(std::isfinite(y[2]) && y[2] > 3e38f);
  EXPECT_TRUE(std::isfinite(y[3]) && y[3] < -3e38f);
}

// ---- (4) edge cases --------------------------------------------------------------------------

TEST_P(QuantTypeTest, ZerosStayZero) {
  const GgmlType t = GetParam();
  const std::vector<float> x(512, 0.0f);
  const auto y = RoundTrip(t, x);
  for (int i = 0; i < 512; ++i) ASSERT_EQ(y[i], 0.0f) << i;
}

TEST_P(BlockTypeTest, OneHugeOutlier) {
  const GgmlType t = GetParam();
  auto x = Normal(512, 21);
  x[77] = 1000.0f;
  x[300] = -1000.0f;
  const auto y = RoundTrip(t, x);
  ASSERT_TRUE(AllFinite(y));
  EXPECT_NEAR(y[77], 1000.0f, 10.0f);
  EXPECT_NEAR(y[300], -1000.0f, 10.0f);
  // The outlier must not blow up its neighbours: every decoded value stays within its range.
  for (int i = 0; i < 512; ++i) ASSERT_LE(std::fabs(y[i]), 1010.0f) << i;
  EXPECT_LE(RelRms(x, y), 2 * ErrorBound(t));
}

TEST_P(BlockTypeTest, NegativeOnlyAndConstantBlocks) {
  const GgmlType t = GetParam();
  auto x = Normal(1024, 31);
  for (auto& v : x) v = -std::fabs(v) - 0.5f;
  const auto y = RoundTrip(t, x);
  ASSERT_TRUE(AllFinite(y));
  std::printf("[ measured ] %s negative-only rel RMS error %.5f\n",
              std::string(GgmlInfo(t).name).c_str(), RelRms(x, y));
  EXPECT_LE(RelRms(x, y), ErrorBound(t));
  for (int i = 0; i < 1024; ++i) ASSERT_LE(y[i], 0.0f) << i;

  const std::vector<float> c(512, -3.0f), p(512, 2.5f);
  EXPECT_LE(RelRms(c, RoundTrip(t, c)), ErrorBound(t)) << "constant -3";
  EXPECT_LE(RelRms(p, RoundTrip(t, p)), ErrorBound(t)) << "constant 2.5";
}

TEST_P(BlockTypeTest, ExtremeInputsGiveFiniteOutput) {
  const GgmlType t = GetParam();
  auto x = Normal(512, 41);
  x[0] = FLT_MAX;
  x[1] = -FLT_MAX;
  x[260] = std::numeric_limits<float>::infinity();
  x[261] = std::nanf("");
  for (int i = 300; i < 400; ++i) x[i] = 1e-30f * x[i];  // far below fp16 range
  for (int i = 400; i < 512; ++i) x[i] = 1e30f * x[i];   // far above fp16 range
  const auto y = RoundTrip(t, x);
  EXPECT_TRUE(AllFinite(y));
}

TEST(QuantTable, SupportedSetMatchesGgmlTypeTable) {
  for (const auto& info : kGgmlTypes)
    EXPECT_EQ(QuantTypeSupported(info.type), info.supported) << info.name;
  float y[32];
  const uint8_t zeros[18] = {};
  DequantizeRow(GgmlType::Q4_0, zeros, y, 32);  // unsupported: NaN-filled, no crash
  EXPECT_TRUE(std::isnan(y[0]) && std::isnan(y[31]));
  EXPECT_TRUE(std::isnan(DotRow(GgmlType::Q4_0, zeros, y, 32)));
}

}  // namespace
}  // namespace ds::cpu
