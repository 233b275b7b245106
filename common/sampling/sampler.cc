#include "common/sampling/sampler.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <limits>

#include "common/sampling/kernels.h"
#include "common/util/status.h"

namespace ds::sampling {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Top-p histogram: bin = float bits >> 20 (sign 0, 8 exponent bits, top 3 mantissa bits), which
// is monotone in the weight; weights are in [0, 1] so bins stay <= 0x3F8.
constexpr int kHistShift = 20;
constexpr size_t kHistBins = 1024;
constexpr size_t kHistCopies = 4;  // interleaved copies break the load-add-store chain on hot bins
// Copies are not 4 KiB apart: a store to bin b of one copy would otherwise falsely alias (4K
// aliasing) the load of bin b of the next copy and serialize the loop.
constexpr size_t kHistStride = kHistBins + 16;

inline float SanitizeOne(float v) { return std::isnan(v) ? kNegInf : std::min(v, FLT_MAX); }

int32_t FirstIndexOf(const std::vector<float>& x, float v) {
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] == v) return static_cast<int32_t>(i);
  }
  return 0;
}

}  // namespace

Sampler::Sampler(SamplingParams params) : params_(std::move(params)) {}

absl::StatusOr<Sampler> Sampler::Create(SamplingParams params, int n_vocab) {
  DS_RETURN_IF_ERROR(Validate(params, n_vocab));
  return Sampler(std::move(params));
}

float Sampler::Load(std::span<const float> logits) {
  work_.resize(logits.size());
  return internal::CopySanitizedMax(logits.data(), logits.size(), work_.data());
}

void Sampler::SelectTopK(const float* x, size_t n, size_t k, std::vector<Candidate>& out) {
  out.clear();
  if (k == 0) return;
  if (k >= n) {
    for (size_t i = 0; i < n; ++i) out.push_back({x[i], static_cast<int32_t>(i)});
    return;
  }
  // Buffer up to `cap` candidates; when full, keep the best k and raise the admission threshold
  // to the k-th best value. Later ids are larger, so a later value equal to the threshold loses
  // the tie and is rejected with a strict compare. Amortized O(n) with a well-predicted branch.
  const size_t cap = std::max<size_t>(2 * k, 64);
  out.reserve(cap);
  auto prune = [&] {
    std::nth_element(out.begin(), out.begin() + static_cast<ptrdiff_t>(k - 1), out.end(), Better);
    out.resize(k);
    return out[k - 1].v;
  };
  size_t i = 0;
  for (; i < n && out.size() < cap; ++i) out.push_back({x[i], static_cast<int32_t>(i)});
  float thr = prune();
  for (; i < n; ++i) {
    if (x[i] > thr) {
      out.push_back({x[i], static_cast<int32_t>(i)});
      if (out.size() == cap) thr = prune();
    }
  }
  if (out.size() > k) prune();
}

bool Sampler::ApplyPenalties(std::span<const int32_t> history) {
  const SamplingParams& p = params_;
  const bool rep = p.repetition_penalty != 1.0f && p.repetition_penalty > 0.0f;
  const bool add = p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
  if ((!rep && !add) || p.penalty_last_n == 0 || history.empty()) return false;
  const size_t window = p.penalty_last_n < 0
                            ? history.size()
                            : std::min(history.size(), static_cast<size_t>(p.penalty_last_n));
  const std::span<const int32_t> recent = history.last(window);
  const size_t n = work_.size();
  if (counts_.size() < n) counts_.resize(n, 0);
  for (int32_t t : recent) {
    if (t >= 0 && static_cast<size_t>(t) < n) ++counts_[t];
  }
  bool any = false;
  for (int32_t t : recent) {
    if (t < 0 || static_cast<size_t>(t) >= n || counts_[t] == 0) continue;
    const float c = static_cast<float>(counts_[t]);
    counts_[t] = 0;  // applied once per distinct token; also restores the all-zero invariant
    float& l = work_[t];
    if (rep) l = l > 0.0f ? l / p.repetition_penalty : l * p.repetition_penalty;
    l -= c * p.frequency_penalty + p.presence_penalty;
    any = true;
  }
  return any;
}

void Sampler::FinishExplicit(bool apply_top_p) {
  // Steps 6-7 on explicit candidates holding weights (max weight exactly 1).
  if (apply_top_p && params_.top_p < 1.0f) {
    std::sort(cand_.begin(), cand_.end(), Better);
    double total = 0.0;
    for (const Candidate& c : cand_) total += c.v;
    const double target = static_cast<double>(std::max(params_.top_p, 0.0f)) * total;
    double cum = 0.0;
    for (size_t i = 0; i < cand_.size(); ++i) {
      cum += cand_[i].v;
      if (cum >= target) {
        cand_.resize(i + 1);
        break;
      }
    }
  }
  // Both filters keep a most-likely prefix, so applying min-p to the nucleus in any order gives
  // the same set.
  const float min_p = std::clamp(params_.min_p, 0.0f, 1.0f);
  std::erase_if(cand_, [&](const Candidate& c) { return !(c.v > 0.0f) || c.v < min_p; });
  SortCandidatesById();
  total_ = 0.0;
  for (const Candidate& c : cand_) total_ += c.v;
  explicit_ = true;
}

void Sampler::SortCandidatesById() {
  // The draw walks candidates in ascending id (see the header). Top-k / small nuclei: sort.
  // Large nuclei (a flat top-p): scatter into a vocabulary-sized buffer and sweep it, O(V).
  auto by_id = [](const Candidate& a, const Candidate& b) { return a.id < b.id; };
  if (std::is_sorted(cand_.begin(), cand_.end(), by_id)) return;
  if (cand_.size() <= 4096) {
    std::sort(cand_.begin(), cand_.end(), by_id);
    return;
  }
  const size_t n = work_.size();
  if (dense_.size() < n) dense_.resize(n, 0.0f);
  for (const Candidate& c : cand_) dense_[c.id] = c.v;  // every weight is > 0 here
  cand_.clear();
  for (size_t i = 0; i < n; ++i) {
    if (dense_[i] > 0.0f) {
      cand_.push_back({dense_[i], static_cast<int32_t>(i)});
      dense_[i] = 0.0f;
    }
  }
}

void Sampler::TopPFullVocab() {
  // work_ holds weights in [0, 1]; positive floats order like their bit patterns. Radix select on
  // the bits: histogram the mass by bits >> 20 (8 bins per octave), find the bin where the mass
  // accumulated from the top reaches top_p. Tokens in higher bins are all in the nucleus (no
  // sorting needed); only the boundary bin is refined, by the next 8 bits, then the next 8, and
  // what is left is sorted. So a flat distribution with a 200k-token nucleus sorts a few tokens.
  const size_t n = work_.size();
  hist_.assign(kHistCopies * kHistStride, 0.0);
  internal::MassHistogram(work_.data(), n, hist_.data(), kHistStride);
  double total = 0.0;
  for (size_t b = 0; b < kHistBins; ++b) {
    for (size_t c = 1; c < kHistCopies; ++c) hist_[b] += hist_[c * kHistStride + b];
    total += hist_[b];
  }
  // Mass still needed from the boundary bin and below; stays > 0 because a bin is chosen as the
  // boundary only when the mass above it falls short.
  double need = static_cast<double>(params_.top_p) * total;
  uint32_t bstar = 0;
  for (uint32_t b = kHistBins; b-- > 0;) {
    if (hist_[b] >= need || b == 0) {
      bstar = b;
      break;
    }
    need -= hist_[b];
  }
  cand_.clear();
  boundary_.clear();
  idx_.clear();
  internal::CollectAtLeast(work_.data(), n, std::bit_cast<float>(bstar << kHistShift), idx_);
  for (int32_t i : idx_) {
    const float w = work_[i];
    (std::bit_cast<uint32_t>(w) >> kHistShift > bstar ? cand_ : boundary_).push_back({w, i});
  }
  for (int shift : {12, 4}) {
    if (boundary_.size() <= 64) break;
    const uint32_t mask = 0xFF;
    double sub[256] = {};
    for (const Candidate& c : boundary_) sub[(std::bit_cast<uint32_t>(c.v) >> shift) & mask] += c.v;
    uint32_t sstar = 0;
    for (uint32_t b = 256; b-- > 0;) {
      if (sub[b] >= need || b == 0) {
        sstar = b;
        break;
      }
      need -= sub[b];
    }
    size_t keep = 0;
    for (const Candidate& c : boundary_) {
      const uint32_t b = (std::bit_cast<uint32_t>(c.v) >> shift) & mask;
      if (b > sstar) cand_.push_back(c);
      if (b == sstar) boundary_[keep++] = c;
    }
    boundary_.resize(keep);
  }
  std::sort(boundary_.begin(), boundary_.end(), Better);
  double cum = 0.0;
  for (const Candidate& c : boundary_) {
    cand_.push_back(c);
    cum += c.v;
    if (cum >= need) break;
  }
  FinishExplicit(/*apply_top_p=*/false);
}

int32_t Sampler::Filter(float raw_max, std::span<const int32_t> history) {
  const SamplingParams& p = params_;
  const size_t n = work_.size();
  const bool penalized = ApplyPenalties(history);
  if (!(p.temperature > 0.0f) || !(raw_max > kNegInf)) {
    const float m = penalized ? internal::Max(work_.data(), n) : raw_max;
    return FirstIndexOf(work_, m);
  }
  const float inv_t = std::min(1.0f / p.temperature, FLT_MAX);
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < n) {
    SelectTopK(work_.data(), n, static_cast<size_t>(p.top_k), cand_);
    float m = kNegInf;
    for (const Candidate& c : cand_) m = std::max(m, c.v);
    if (!(m > kNegInf)) return FirstIndexOf(work_, m);
    for (Candidate& c : cand_) c.v = internal::Exp((c.v - m) * inv_t);
    FinishExplicit(/*apply_top_p=*/true);
    return -1;
  }
  const float m = penalized ? internal::Max(work_.data(), n) : raw_max;
  if (!(m > kNegInf)) return FirstIndexOf(work_, m);
  block_sums_.resize((n + internal::kSumBlock - 1) / internal::kSumBlock);
  total_ = internal::ExpSum(work_.data(), n, m, inv_t, work_.data(), block_sums_.data());
  if (p.top_p < 1.0f) {
    TopPFullVocab();
  } else if (p.min_p > 0.0f) {
    const float min_p = std::min(p.min_p, 1.0f);
    idx_.clear();
    internal::CollectAtLeast(work_.data(), n, min_p, idx_);
    cand_.clear();
    for (int32_t i : idx_) cand_.push_back({work_[i], i});
    FinishExplicit(/*apply_top_p=*/true);
  } else {
    explicit_ = false;
  }
  return -1;
}

int32_t Sampler::Draw(double u) const {
  const double target = u * total_;
  double cum = 0.0;
  if (explicit_) {
    for (const Candidate& c : cand_) {
      cum += c.v;
      if (target < cum) return c.id;
    }
    // u * total rounded up to total: the last candidate (all have positive weight).
    return cand_.empty() ? 0 : cand_.back().id;
  }
  const size_t n = work_.size();
  for (size_t b = 0; b < block_sums_.size(); ++b) {
    if (target >= cum + block_sums_[b]) {
      cum += block_sums_[b];
      continue;
    }
    const size_t b0 = b * internal::kSumBlock;
    const size_t b1 = std::min(n, b0 + internal::kSumBlock);
    for (size_t i = b0; i < b1; ++i) {
      cum += work_[i];
      if (target < cum) return static_cast<int32_t>(i);
    }
    // The sequential in-block sum fell short of the lane-wise block sum by rounding.
    for (size_t i = b1; i-- > b0;) {
      if (work_[i] > 0.0f) return static_cast<int32_t>(i);
    }
  }
  for (size_t i = n; i-- > 0;) {
    if (work_[i] > 0.0f) return static_cast<int32_t>(i);
  }
  return 0;
}

SampleResult Sampler::Sample(std::span<const float> logits, std::span<const int32_t> history) {
  SampleResult res;
  const size_t n = logits.size();
  if (n == 0) {
    res.logprob = kNegInf;
    return res;
  }
  const float raw_max = Load(logits);
  double lse = raw_max;  // log-normalizer of the unmodified distribution
  if (raw_max > kNegInf) {
    lse = raw_max + std::log(internal::ExpSum(work_.data(), n, raw_max, 1.0f, nullptr, nullptr));
  }
  const int n_lp = std::clamp(params_.n_logprobs, 0, kMaxLogprobs);
  if (n_lp > 0) {
    SelectTopK(work_.data(), n, static_cast<size_t>(n_lp), lp_cand_);
    std::sort(lp_cand_.begin(), lp_cand_.end(), Better);
    res.top_logprobs.reserve(lp_cand_.size());
    for (const Candidate& c : lp_cand_) {
      const float lp = raw_max > kNegInf ? static_cast<float>(c.v - lse) : kNegInf;
      res.top_logprobs.emplace_back(c.id, lp);
    }
  }
  int32_t tok = Filter(raw_max, history);
  if (tok < 0) tok = Draw(UniformAt(history.size()));
  res.token = tok;
  res.logprob = raw_max > kNegInf ? static_cast<float>(SanitizeOne(logits[tok]) - lse) : kNegInf;
  return res;
}

int32_t Sampler::TokenWith(std::span<const float> logits, std::span<const int32_t> history,
                           double u) {
  if (logits.empty()) return -1;
  const int32_t tok = Filter(Load(logits), history);
  return tok >= 0 ? tok : Draw(u);
}

int32_t Sampler::Argmax(std::span<const float> logits, std::span<const int32_t> history) {
  if (logits.empty()) return -1;
  const float raw_max = Load(logits);
  const bool penalized = ApplyPenalties(history);
  return FirstIndexOf(work_, penalized ? internal::Max(work_.data(), work_.size()) : raw_max);
}

std::vector<std::pair<int32_t, double>> Sampler::Distribution(std::span<const float> logits,
                                                              std::span<const int32_t> history) {
  std::vector<std::pair<int32_t, double>> out;
  if (logits.empty()) return out;
  const float raw_max = Load(logits);
  const int32_t tok = Filter(raw_max, history);
  if (tok >= 0) {
    out.emplace_back(tok, 1.0);
    return out;
  }
  if (explicit_) {
    for (const Candidate& c : cand_) out.emplace_back(c.id, c.v / total_);
  } else {
    for (size_t i = 0; i < work_.size(); ++i) {
      if (work_[i] > 0.0f) out.emplace_back(static_cast<int32_t>(i), work_[i] / total_);
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.second > b.second || (a.second == b.second && a.first < b.first);
  });
  return out;
}

}  // namespace ds::sampling
