// The CPU reference of the int8 matmuls (kernels/cpu/mmq_ref.h): the activation quantizer on
// known answers, the exact Q6_K x int8 dot against the dequantized row, and the kernel-order f32
// version against the exact one.
#include "kernels/cpu/mmq_ref.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/util/half.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/quant_blocks.h"

namespace ds::cpu {
namespace {

TEST(MmqRef, QuantizerKnownAnswers) {
  std::vector<float> x(64, 0.f);
  x[0] = 127.f;   // amax: d = 1
  x[1] = -63.5f;  // halfway: to even (-64)
  x[2] = 0.5f;    // halfway: to even (0)
  x[3] = 1.5f;    // halfway: to even (2)
  x[4] = -127.f;
  // x[32..63] stays zero: d = 0, q = 0.
  std::vector<int8_t> q(64, 99);
  std::vector<float> d(2, -1.f);
  QuantizeActivationsQ8(x.data(), 64, q.data(), d.data());
  EXPECT_EQ(d[0], 1.f);
  EXPECT_EQ(q[0], 127);
  EXPECT_EQ(q[1], -64);
  EXPECT_EQ(q[2], 0);
  EXPECT_EQ(q[3], 2);
  EXPECT_EQ(q[4], -127);
  EXPECT_EQ(q[5], 0);
  EXPECT_EQ(d[1], 0.f);
  for (int i = 32; i < 64; ++i) EXPECT_EQ(q[i], 0) << i;
}

TEST(MmqRef, QuantizerErrorWithinHalfStep) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-3.f, 3.f);
  std::vector<float> x(32 * 40);
  for (auto& v : x) v = u(rng);
  std::vector<int8_t> q(x.size());
  std::vector<float> d(x.size() / 32);
  QuantizeActivationsQ8(x.data(), static_cast<int64_t>(x.size()), q.data(), d.data());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_LE(std::fabs(x[i] - d[i / 32] * q[i]), 0.5001 * d[i / 32]) << i;
    EXPECT_LE(std::abs(static_cast<int>(q[i])), 127);
  }
}

// A hand-built block: every centred quant 1 (q = 33: low nibble 1, high bits 2), every
// sub-block scale 2, d = 0.5, so w = 1 everywhere; activations 3 with d 0.25: 256 * 0.75.
TEST(MmqRef, Q6KKnownAnswer) {
  BlockQ6K b;
  std::memset(b.ql, 0x11, sizeof(b.ql));
  std::memset(b.qh, 0xAA, sizeof(b.qh));
  for (auto& s : b.scales) s = 2;
  b.d = F32ToF16(0.5f);
  std::vector<int8_t> xq(256, 3);
  std::vector<float> xd(8, 0.25f);
  double abs_sum = 0;
  EXPECT_EQ(MmqDotQ6K(&b, xq.data(), xd.data(), 256, &abs_sum), 192.0);
  EXPECT_EQ(abs_sum, 192.0);
  EXPECT_EQ(MmqDotQ6KKernelOrder(&b, xq.data(), xd.data(), 256), 192.f);
  std::vector<float> w(256);
  DequantizeRow(GgmlType::Q6_K, &b, w.data(), 256);
  for (float v : w) ASSERT_EQ(v, 1.f);
}

// Random rows: the exact reference equals the dequantized row times the dequantized int8
// activations (to double rounding), and the kernel-order f32 sum is within f32 rounding of it.
TEST(MmqRef, Q6KMatchesDequantizedDot) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int K : {256, 768, 2048, 5120}) {
    std::vector<float> wf(K), x(K);
    for (auto& v : wf) v = u(rng) * 0.05f;
    for (auto& v : x) v = u(rng) * 2.f;
    std::vector<uint8_t> row(GgmlRowBytes(GgmlType::Q6_K, K));
    QuantizeRow(GgmlType::Q6_K, wf.data(), row.data(), K);
    std::vector<int8_t> xq(K);
    std::vector<float> xd(K / 32);
    QuantizeActivationsQ8(x.data(), K, xq.data(), xd.data());
    std::vector<float> w(K);
    DequantizeRow(GgmlType::Q6_K, row.data(), w.data(), K);
    double direct = 0, abs_direct = 0;
    for (int i = 0; i < K; ++i) {
      const double t = static_cast<double>(w[i]) * (static_cast<double>(xd[i / 32]) * xq[i]);
      direct += t;
      abs_direct += std::fabs(t);
    }
    double abs_sum = 0;
    const double exact = MmqDotQ6K(row.data(), xq.data(), xd.data(), K, &abs_sum);
    // w = f32(d * sc) * q on the CPU dequantizer (one f32 rounding) vs d * sc * q in double here.
    EXPECT_NEAR(exact, direct, 1e-6 * abs_direct) << "K=" << K;
    EXPECT_NEAR(abs_sum, abs_direct, 1e-6 * abs_direct) << "K=" << K;
    const float ko = MmqDotQ6KKernelOrder(row.data(), xq.data(), xd.data(), K);
    EXPECT_NEAR(ko, exact, 1e-5 * abs_sum) << "K=" << K;
    EXPECT_GT(abs_sum, 0.0);
  }
}

}  // namespace
}  // namespace ds::cpu
