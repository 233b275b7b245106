// CPU reference for the GGUF weight formats (spec/model.md §10): per-format block codecs gathered
// into one constexpr table (kQuantOps) that DequantizeRow / DotRow / QuantizeRow dispatch through.
#include "kernels/cpu/quant.h"

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <type_traits>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "common/util/half.h"
#include "kernels/cpu/dot_f32.h"
#include "kernels/cpu/quant_blocks.h"

namespace ds::cpu {
namespace {

// ---------------------------------------------------------------------------------------------
// Shared numeric helpers.

// Quantizers treat NaN as 0 and +-inf as +-FLT_MAX so every output is finite.
inline float Sanitize(float v) {
  if (std::isnan(v)) return 0.0f;
  return std::clamp(v, -FLT_MAX, FLT_MAX);
}

// fp16 scale storage: saturate instead of overflowing to inf.
inline uint16_t F16Saturate(double v) {
  constexpr double kF16Max = 65504.0;
  return F32ToF16(static_cast<float>(std::clamp(v, -kF16Max, kF16Max)));
}

// Round-half-to-even of v clamped to [lo, hi] (clamped first, so the conversion never overflows).
inline int RoundClamp(double v, int lo, int hi) {
  if (!(v >= lo)) return lo;  // also catches NaN
  if (v > hi) return hi;
  return static_cast<int>(std::nearbyint(v));
}

// Index of the kIq4Values entry nearest to v (v in codebook units).
inline int NearestIq4(double v) {
  // Midpoints between consecutive codebook values; the codebook is sorted ascending.
  static constexpr std::array<double, 15> kMid = [] {
    std::array<double, 15> m{};
    for (int i = 0; i < 15; ++i) m[i] = 0.5 * (kIq4Values[i] + kIq4Values[i + 1]);
    return m;
  }();
  return static_cast<int>(std::upper_bound(kMid.begin(), kMid.end(), v) - kMid.begin());
}

// ---------------------------------------------------------------------------------------------
// Scale fitting (double precision: inputs may be as large as FLT_MAX).

// Fits x ~= s * q + m, q in [0, nmax], m <= 0, for a sub-block of n values. Tries a sweep of
// initial step sizes, and for each the least-squares (s, m) of the resulting q; keeps the lowest
// squared error. Returns s >= 0 and minv = -m >= 0.
void FitScaleMin(const float* x, int n, int nmax, double* scale, double* minv) {
  double lo = 0.0, hi = -DBL_MAX;
  for (int i = 0; i < n; ++i) {
    lo = std::min<double>(lo, x[i]);
    hi = std::max<double>(hi, x[i]);
  }
  if (hi <= lo) {  // every value equals lo <= 0
    *scale = 0.0;
    *minv = -lo;
    return;
  }
  double best_s = (hi - lo) / nmax, best_m = lo, best_err = DBL_MAX;
  int q[kQK_K];
  for (int step = -10; step <= 10; ++step) {
    const double iscale = (nmax + 0.1 * step) / (hi - lo);
    double sq = 0, sqq = 0, sx = 0, sqx = 0;
    for (int i = 0; i < n; ++i) {
      q[i] = RoundClamp(iscale * (x[i] - lo), 0, nmax);
      sq += q[i];
      sqq += static_cast<double>(q[i]) * q[i];
      sx += x[i];
      sqx += q[i] * static_cast<double>(x[i]);
    }
    double s, m;
    const double det = n * sqq - sq * sq;
    if (det <= 0) continue;
    s = (n * sqx - sq * sx) / det;
    m = (sqq * sx - sq * sqx) / det;
    if (m > 0) {  // the format only has x = s*q - minv with minv >= 0
      m = 0;
      s = sqx / sqq;
    }
    if (!(s > 0)) continue;
    double err = 0;
    for (int i = 0; i < n; ++i) {
      const double e = s * q[i] + m - x[i];
      err += e * e;
    }
    if (err < best_err) {
      best_err = err;
      best_s = s;
      best_m = m;
    }
  }
  *scale = best_s;
  *minv = -best_m;
}

// Fits x ~= s * q, q integer in [-nneg, npos] (signed s). The element of largest magnitude is
// mapped near -nneg (the wider side), with a sweep of steps and a least-squares s per candidate.
double FitSymmetric(const float* x, int n, int nneg, int npos) {
  double vmax = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > std::fabs(vmax)) vmax = x[i];
  if (vmax == 0) return 0.0;
  double best_s = vmax / -nneg, best_err = DBL_MAX;
  for (int step = -8; step <= 8; ++step) {
    const double iscale = -(nneg + 0.1 * step) / vmax;
    double sqq = 0, sqx = 0;
    int q[kQK_K];
    for (int i = 0; i < n; ++i) {
      q[i] = RoundClamp(iscale * x[i], -nneg, npos);
      sqq += static_cast<double>(q[i]) * q[i];
      sqx += q[i] * static_cast<double>(x[i]);
    }
    if (sqq == 0) continue;
    const double s = sqx / sqq;
    double err = 0;
    for (int i = 0; i < n; ++i) {
      const double e = s * q[i] - x[i];
      err += e * e;
    }
    if (err < best_err) {
      best_err = err;
      best_s = s;
    }
  }
  return best_s;
}

// Codes (nearest codebook entries) of x for scale s, and the squared error.
double Iq4Codes(const float* x, int n, double s, uint8_t* codes) {
  double err = 0;
  for (int i = 0; i < n; ++i) {
    const int c = s != 0 ? NearestIq4(x[i] / s) : 8;  // any code decodes to 0 when s == 0
    codes[i] = static_cast<uint8_t>(c);
    const double e = s * kIq4Values[c] - x[i];
    err += e * e;
  }
  return err;
}

// Fits x ~= s * K[code] for one 32-wide sub-block: the largest-magnitude element is tried at
// several positions near either end of the codebook; each candidate's codes get a least-squares s.
double FitIq4(const float* x, int n) {
  double vmax = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > std::fabs(vmax)) vmax = x[i];
  if (vmax == 0) return 0.0;
  double best_s = vmax / kIq4Values[0], best_err = DBL_MAX;
  uint8_t codes[kQK_K];
  for (const double end :
       {static_cast<double>(kIq4Values[0]), static_cast<double>(kIq4Values[15])}) {
    for (int step = -8; step <= 8; ++step) {
      const double target = end + step * (end < 0 ? 1.0 : -1.0);  // move inwards / outwards
      Iq4Codes(x, n, vmax / target, codes);
      double skk = 0, skx = 0;
      for (int i = 0; i < n; ++i) {
        skk += static_cast<double>(kIq4Values[codes[i]]) * kIq4Values[codes[i]];
        skx += kIq4Values[codes[i]] * static_cast<double>(x[i]);
      }
      if (skk == 0) continue;
      const double s = skx / skk;
      const double err = Iq4Codes(x, n, s, codes);
      if (err < best_err) {
        best_err = err;
        best_s = s;
      }
    }
  }
  return best_s;
}

// ---------------------------------------------------------------------------------------------
// Block formats. Each has: Block, kType, kElems, Dequant(const Block&, float* y /*[kElems]*/),
// Quantize(const float* x /*[kElems], finite*/, Block*).

struct Q8_0Fmt {
  using Block = BlockQ8_0;
  static constexpr GgmlType kType = GgmlType::Q8_0;
  static constexpr int kElems = kQK8_0;

  static void Dequant(const Block& b, float* y) {
    const float d = F16ToF32(b.d);
    for (int j = 0; j < kElems; ++j) y[j] = d * b.qs[j];
  }
  static void Quantize(const float* x, Block* b) {
    double amax = 0;
    for (int j = 0; j < kElems; ++j) amax = std::max<double>(amax, std::fabs(x[j]));
    b->d = F16Saturate(amax / 127.0);
    // Round against the stored (fp16) d so the error is that of the decoded values.
    const double d = F16ToF32(b->d);
    const double id = d > 0 ? 1.0 / d : 0.0;
    for (int j = 0; j < kElems; ++j)
      b->qs[j] = static_cast<int8_t>(RoundClamp(x[j] * id, -127, 127));
  }
};

// Q4_K and Q5_K share the scale/min scheme; kBits selects the 4- or 5-bit payload.
template <int kBits>
struct KQuantScaleMin {
  static constexpr int kNmax = (1 << kBits) - 1;

  // Fills d, dmin, scales[12] and returns q[256] in [0, kNmax].
  template <class Block>
  static void Quantize(const float* x, Block* b, uint8_t* q) {
    double scale[8], minv[8], max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
      FitScaleMin(x + 32 * j, 32, kNmax, &scale[j], &minv[j]);
      max_scale = std::max(max_scale, scale[j]);
      max_min = std::max(max_min, minv[j]);
    }
    b->d = F16Saturate(max_scale / 63.0);
    b->dmin = F16Saturate(max_min / 63.0);
    const double d = F16ToF32(b->d), dmin = F16ToF32(b->dmin);
    const double id = d > 0 ? 1.0 / d : 0.0, idmin = dmin > 0 ? 1.0 / dmin : 0.0;
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; ++j) {
      sc[j] = static_cast<uint8_t>(RoundClamp(scale[j] * id, 0, 63));
      mn[j] = static_cast<uint8_t>(RoundClamp(minv[j] * idmin, 0, 63));
    }
    // Inverse of UnpackKScaleMin: j < 4 in the low 6 bits, j >= 4 split into nibbles + top bits.
    std::memset(b->scales, 0, sizeof(b->scales));
    for (int j = 0; j < 4; ++j) {
      b->scales[j] = sc[j];
      b->scales[j + 4] = mn[j];
    }
    for (int j = 4; j < 8; ++j) {
      b->scales[j + 4] = static_cast<uint8_t>((sc[j] & 0x0F) | ((mn[j] & 0x0F) << 4));
      b->scales[j - 4] |= static_cast<uint8_t>((sc[j] >> 4) << 6);
      b->scales[j] |= static_cast<uint8_t>((mn[j] >> 4) << 6);
    }
    // Re-round every element against the decoded (quantized) sub-block scale and min.
    for (int j = 0; j < 8; ++j) {
      const double ds = d * sc[j], dm = dmin * mn[j];
      for (int i = 0; i < 32; ++i)
        q[32 * j + i] =
            static_cast<uint8_t>(ds > 0 ? RoundClamp((x[32 * j + i] + dm) / ds, 0, kNmax) : 0);
    }
  }
};

struct Q4KFmt {
  using Block = BlockQ4K;
  static constexpr GgmlType kType = GgmlType::Q4_K;
  static constexpr int kElems = kQK_K;

  static void Dequant(const Block& b, float* y) {
    const float d = F16ToF32(b.d), dmin = F16ToF32(b.dmin);
    for (int c = 0; c < 4; ++c) {
      uint8_t sc0, mn0, sc1, mn1;
      UnpackKScaleMin(b.scales, 2 * c, &sc0, &mn0);
      UnpackKScaleMin(b.scales, 2 * c + 1, &sc1, &mn1);
      const float d0 = d * sc0, m0 = dmin * mn0, d1 = d * sc1, m1 = dmin * mn1;
      const uint8_t* qs = b.qs + 32 * c;
      float* yc = y + 64 * c;
      for (int l = 0; l < 32; ++l) {
        yc[l] = d0 * (qs[l] & 0x0F) - m0;
        yc[l + 32] = d1 * (qs[l] >> 4) - m1;
      }
    }
  }
  static void Quantize(const float* x, Block* b) {
    uint8_t q[kQK_K];
    KQuantScaleMin<4>::Quantize(x, b, q);
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l)
        b->qs[32 * c + l] = static_cast<uint8_t>(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
  }
};

struct Q5KFmt {
  using Block = BlockQ5K;
  static constexpr GgmlType kType = GgmlType::Q5_K;
  static constexpr int kElems = kQK_K;

  static void Dequant(const Block& b, float* y) {
    const float d = F16ToF32(b.d), dmin = F16ToF32(b.dmin);
    for (int c = 0; c < 4; ++c) {
      uint8_t sc0, mn0, sc1, mn1;
      UnpackKScaleMin(b.scales, 2 * c, &sc0, &mn0);
      UnpackKScaleMin(b.scales, 2 * c + 1, &sc1, &mn1);
      const float d0 = d * sc0, m0 = dmin * mn0, d1 = d * sc1, m1 = dmin * mn1;
      const uint8_t* qs = b.qs + 32 * c;
      float* yc = y + 64 * c;
      for (int l = 0; l < 32; ++l) {
        const int h0 = ((b.qh[l] >> (2 * c)) & 1) << 4;
        const int h1 = ((b.qh[l] >> (2 * c + 1)) & 1) << 4;
        yc[l] = d0 * ((qs[l] & 0x0F) | h0) - m0;
        yc[l + 32] = d1 * ((qs[l] >> 4) | h1) - m1;
      }
    }
  }
  static void Quantize(const float* x, Block* b) {
    uint8_t q[kQK_K];
    KQuantScaleMin<5>::Quantize(x, b, q);
    std::memset(b->qh, 0, sizeof(b->qh));
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t lo = q[64 * c + l], hi = q[64 * c + 32 + l];
        b->qs[32 * c + l] = static_cast<uint8_t>((lo & 0x0F) | ((hi & 0x0F) << 4));
        b->qh[l] |= static_cast<uint8_t>(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
      }
    }
  }
};

struct Q6KFmt {
  using Block = BlockQ6K;
  static constexpr GgmlType kType = GgmlType::Q6_K;
  static constexpr int kElems = kQK_K;

  static void Dequant(const Block& b, float* y) {
    const float d = F16ToF32(b.d);
    for (int n = 0; n < 2; ++n) {
      const uint8_t* ql = b.ql + 64 * n;
      const uint8_t* qh = b.qh + 32 * n;
      const int8_t* sc = b.scales + 8 * n;
      float* yn = y + 128 * n;
      for (int l = 0; l < 32; ++l) {
        const int s = l / 16;
        const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        yn[l] = d * sc[s + 0] * q1;
        yn[l + 32] = d * sc[s + 2] * q2;
        yn[l + 64] = d * sc[s + 4] * q3;
        yn[l + 96] = d * sc[s + 6] * q4;
      }
    }
  }
  static void Quantize(const float* x, Block* b) {
    // Element e belongs to scale e / 16 (element 128n + l + 32k uses scales[8n + 2k + l/16]).
    double scale[16], amax = 0;
    for (int j = 0; j < 16; ++j) {
      scale[j] = FitSymmetric(x + 16 * j, 16, 32, 31);
      amax = std::max(amax, std::fabs(scale[j]));
    }
    b->d = F16Saturate(amax / 127.0);
    const double d = F16ToF32(b->d);
    const double id = d > 0 ? 1.0 / d : 0.0;
    uint8_t q[kQK_K];  // biased by 32: 0..63
    for (int j = 0; j < 16; ++j) {
      b->scales[j] = static_cast<int8_t>(RoundClamp(scale[j] * id, -127, 127));
      const double ds = d * b->scales[j];
      for (int i = 0; i < 16; ++i)
        q[16 * j + i] =
            static_cast<uint8_t>(32 + (ds != 0 ? RoundClamp(x[16 * j + i] / ds, -32, 31) : 0));
    }
    for (int n = 0; n < 2; ++n) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t* qn = q + 128 * n;
        const uint8_t q1 = qn[l], q2 = qn[l + 32], q3 = qn[l + 64], q4 = qn[l + 96];
        b->ql[64 * n + l] = static_cast<uint8_t>((q1 & 0x0F) | ((q3 & 0x0F) << 4));
        b->ql[64 * n + l + 32] = static_cast<uint8_t>((q2 & 0x0F) | ((q4 & 0x0F) << 4));
        b->qh[32 * n + l] = static_cast<uint8_t>((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) |
                                                 ((q4 >> 4) << 6));
      }
    }
  }
};

// Packs 32 codes of one IQ4 (sub-)block: element j low nibble, element j + 16 high nibble.
inline void PackIq4(const uint8_t* codes, uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>(codes[j] | (codes[j + 16] << 4));
}
inline void UnpackIq4(const uint8_t* qs, float dl, float* y) {
  for (int j = 0; j < 16; ++j) {
    y[j] = dl * kIq4Values[qs[j] & 0x0F];
    y[j + 16] = dl * kIq4Values[qs[j] >> 4];
  }
}

struct Iq4NlFmt {
  using Block = BlockIq4Nl;
  static constexpr GgmlType kType = GgmlType::IQ4_NL;
  static constexpr int kElems = kQK4_NL;

  static void Dequant(const Block& b, float* y) { UnpackIq4(b.qs, F16ToF32(b.d), y); }
  static void Quantize(const float* x, Block* b) {
    b->d = F16Saturate(FitIq4(x, kElems));
    uint8_t codes[kElems];
    Iq4Codes(x, kElems, F16ToF32(b->d), codes);
    PackIq4(codes, b->qs);
  }
};

struct Iq4XsFmt {
  using Block = BlockIq4Xs;
  static constexpr GgmlType kType = GgmlType::IQ4_XS;
  static constexpr int kElems = kQK_K;

  static void Dequant(const Block& b, float* y) {
    const float d = F16ToF32(b.d);
    for (int s = 0; s < 8; ++s) {
      const int ls =
          ((b.scales_l[s / 2] >> (4 * (s % 2))) & 0x0F) | (((b.scales_h >> (2 * s)) & 3) << 4);
      UnpackIq4(b.qs + 16 * s, d * (ls - 32), y + 32 * s);
    }
  }

  // Sub-block scale indices l[8] (-32..31) and codes for a given fp16 d; returns squared error.
  // Each sub-block tries the rounded l and its neighbours and keeps the best.
  static double Assign(const float* x, const double* sub_scale, double d, int* l, uint8_t* codes) {
    double total = 0;
    uint8_t trial[32];
    for (int s = 0; s < 8; ++s) {
      const int l0 = d != 0 ? RoundClamp(sub_scale[s] / d, -32, 31) : 0;
      double best = DBL_MAX;
      for (int cand = std::max(-32, l0 - 1); cand <= std::min(31, l0 + 1); ++cand) {
        const double err = Iq4Codes(x + 32 * s, 32, d * cand, trial);
        if (err < best) {
          best = err;
          l[s] = cand;
          std::memcpy(codes + 32 * s, trial, 32);
        }
      }
      total += best;
    }
    return total;
  }

  static void Quantize(const float* x, Block* b) {
    double sub_scale[8], smax = 0;
    for (int s = 0; s < 8; ++s) {
      sub_scale[s] = FitIq4(x + 32 * s, 32);
      if (std::fabs(sub_scale[s]) > std::fabs(smax)) smax = sub_scale[s];
    }
    // The largest sub-block scale maps to l = -32 or l = 31 (both ends of the 6-bit range).
    int l[8] = {}, best_l[8] = {};
    uint8_t codes[kQK_K], best_codes[kQK_K];
    double best_err = DBL_MAX;
    uint16_t best_d = 0;
    for (const double t : {-32.0, 31.0}) {
      const uint16_t dh = F16Saturate(smax / t);
      const double err = Assign(x, sub_scale, F16ToF32(dh), l, codes);
      if (err < best_err) {
        best_err = err;
        best_d = dh;
        std::memcpy(best_l, l, sizeof(l));
        std::memcpy(best_codes, codes, sizeof(codes));
      }
    }
    b->d = best_d;
    b->scales_h = 0;
    std::memset(b->scales_l, 0, sizeof(b->scales_l));
    for (int s = 0; s < 8; ++s) {
      const int ls = best_l[s] + 32;
      b->scales_l[s / 2] |= static_cast<uint8_t>((ls & 0x0F) << (4 * (s % 2)));
      b->scales_h |= static_cast<uint16_t>((ls >> 4) << (2 * s));
      PackIq4(best_codes + 32 * s, b->qs + 16 * s);
    }
  }
};

template <class F>
void DequantBlocks(const void* src, float* dst, int64_t n) {
  const int64_t nb = n / F::kElems;
  for (int64_t i = 0; i < nb; ++i)
    F::Dequant(LoadBlock<typename F::Block>(src, i), dst + i * F::kElems);
}

template <class F>
float DotBlocks(const void* row, const float* x, int64_t n) {
  const int64_t nb = n / F::kElems;
  alignas(32) float buf[F::kElems];
  float total = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    F::Dequant(LoadBlock<typename F::Block>(row, i), buf);
    total += DotF32(buf, x + i * F::kElems, F::kElems);
  }
  return total;
}

template <class F>
void QuantizeBlocks(const float* src, void* dst, int64_t n) {
  const int64_t nb = n / F::kElems;
  float x[F::kElems];
  for (int64_t i = 0; i < nb; ++i) {
    for (int j = 0; j < F::kElems; ++j) x[j] = Sanitize(src[i * F::kElems + j]);
    typename F::Block b;
    F::Quantize(x, &b);
    StoreBlock(dst, i, b);
  }
}

// ---------------------------------------------------------------------------------------------
// Scalar formats (block of one element). Dot runs over chunks of kChunk elements, the tail
// zero-padded, so it shares DotF32 with the block formats.

struct F32Fmt {
  using Elem = float;
  static constexpr GgmlType kType = GgmlType::F32;
  static float Load(Elem v) { return v; }
  static Elem Store(float v) { return v; }  // bit copy, NaN included
};

struct F16Fmt {
  using Elem = uint16_t;
  static constexpr GgmlType kType = GgmlType::F16;
  static float Load(Elem v) { return F16ToF32(v); }
  // RNE; finite values beyond the fp16 range saturate to +-65504 instead of becoming inf.
  static Elem Store(float v) {
    if (std::isfinite(v)) return F16Saturate(v);
    return F32ToF16(v);
  }
};

struct Bf16Fmt {
  using Elem = uint16_t;
  static constexpr GgmlType kType = GgmlType::BF16;
  static float Load(Elem v) { return Bf16ToF32(v); }
  // RNE; finite values that would round up to inf saturate to the largest finite bf16.
  static Elem Store(float v) {
    const uint16_t h = F32ToBf16(v);
    if (std::isfinite(v) && (h & 0x7fffu) == 0x7f80u)
      return static_cast<uint16_t>((h & 0x8000u) | 0x7f7fu);
    return h;
  }
};

constexpr int kChunk = 64;

template <class F>
void DequantScalar(const void* src, float* dst, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  int64_t i = 0;
#if defined(__F16C__) && defined(__AVX2__)
  // Eight at a time with the hardware conversions, which are exact like F16ToF32 / Bf16ToF32
  // (fp16 subnormals included); the one difference, a signalling NaN coming back quiet, never
  // matters for weights. F16 weights are the demo model's: this is most of its CPU decode.
  if constexpr (std::is_same_v<F, F16Fmt>) {
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(
                                    reinterpret_cast<const __m128i*>(p + i * 2))));
  } else if constexpr (std::is_same_v<F, Bf16Fmt>) {
    for (; i + 8 <= n; i += 8) {
      const __m256i w = _mm256_cvtepu16_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i * 2)));
      _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
    }
  }
#endif
  for (; i < n; ++i) {
    typename F::Elem e;
    std::memcpy(&e, p + i * sizeof(e), sizeof(e));
    dst[i] = F::Load(e);
  }
}

template <class F>
float DotScalar(const void* row, const float* x, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(row);
  alignas(32) float buf[kChunk];
  alignas(32) float xb[kChunk];
  float total = 0.0f;
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int len = static_cast<int>(std::min<int64_t>(kChunk, n - i0));
    DequantScalar<F>(p + i0 * sizeof(typename F::Elem), buf, len);
    const float* xs = x + i0;
    if (len < kChunk) {
      std::fill(buf + len, buf + kChunk, 0.0f);
      std::copy(xs, xs + len, xb);
      std::fill(xb + len, xb + kChunk, 0.0f);
      xs = xb;
    }
    total += DotF32(buf, xs, kChunk);
  }
  return total;
}

template <class F>
void QuantizeScalar(const float* src, void* dst, int64_t n) {
  auto* p = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    const typename F::Elem e = F::Store(src[i]);
    std::memcpy(p + i * sizeof(e), &e, sizeof(e));
  }
}

// ---------------------------------------------------------------------------------------------
// The table.

struct QuantOps {
  GgmlType type;
  int block_elems;
  int block_bytes;
  void (*dequant)(const void* src, float* dst, int64_t n);
  float (*dot)(const void* row, const float* x, int64_t n);
  void (*quantize)(const float* src, void* dst, int64_t n);
};

template <class F>
constexpr QuantOps BlockEntry() {
  return {F::kType,          F::kElems,     sizeof(typename F::Block),
          &DequantBlocks<F>, &DotBlocks<F>, &QuantizeBlocks<F>};
}
template <class F>
constexpr QuantOps ScalarEntry() {
  return {F::kType,          1, sizeof(typename F::Elem), &DequantScalar<F>, &DotScalar<F>,
          &QuantizeScalar<F>};
}

constexpr QuantOps kQuantOps[] = {
    ScalarEntry<F32Fmt>(), ScalarEntry<F16Fmt>(),  ScalarEntry<Bf16Fmt>(),
    BlockEntry<Q8_0Fmt>(), BlockEntry<Q4KFmt>(),   BlockEntry<Q5KFmt>(),
    BlockEntry<Q6KFmt>(),  BlockEntry<Iq4NlFmt>(), BlockEntry<Iq4XsFmt>(),
};

// Every supported type of the GGUF type table has exactly one entry, with the same geometry.
constexpr bool TableMatchesGgmlTypes() {
  for (const auto& t : kGgmlTypes) {
    int found = 0;
    for (const auto& o : kQuantOps) {
      if (o.type != t.type) continue;
      ++found;
      if (o.block_elems != t.block_elems || o.block_bytes != t.block_bytes) return false;
    }
    if (found != (t.supported ? 1 : 0)) return false;
  }
  return true;
}
static_assert(TableMatchesGgmlTypes(), "kQuantOps and kGgmlTypes disagree");

constexpr uint32_t kMaxTypeId = 31;
constexpr std::array<int8_t, kMaxTypeId + 1> kOpsIndex = [] {
  std::array<int8_t, kMaxTypeId + 1> idx{};
  idx.fill(-1);
  for (size_t i = 0; i < std::size(kQuantOps); ++i)
    idx[static_cast<uint32_t>(kQuantOps[i].type)] = static_cast<int8_t>(i);
  return idx;
}();

const QuantOps* FindOps(GgmlType type) {
  const auto id = static_cast<uint32_t>(type);
  if (id > kMaxTypeId || kOpsIndex[id] < 0) return nullptr;
  return &kQuantOps[kOpsIndex[id]];
}

}  // namespace

bool QuantTypeSupported(GgmlType type) { return FindOps(type) != nullptr; }

void DequantizeRow(GgmlType type, const void* src, float* dst, int64_t n) {
  if (const QuantOps* ops = FindOps(type)) return ops->dequant(src, dst, n);
  std::fill(dst, dst + n, std::nanf(""));
}

float DotRow(GgmlType type, const void* row, const float* x, int64_t n) {
  if (const QuantOps* ops = FindOps(type)) return ops->dot(row, x, n);
  return std::nanf("");
}

int DotChunk(GgmlType type) {
  const QuantOps* ops = FindOps(type);
  if (!ops) return 0;
  return ops->block_elems == 1 ? kChunk : ops->block_elems;
}

void QuantizeRow(GgmlType type, const float* src, void* dst, int64_t n) {
  if (const QuantOps* ops = FindOps(type)) return ops->quantize(src, dst, n);
  if (FindGgmlType(static_cast<uint32_t>(type)) != nullptr)
    std::memset(dst, 0, GgmlRowBytes(type, n));
}

}  // namespace ds::cpu
