// Gated attention CPU reference (see attention.h; spec/model.md §6.2).
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/util/thread_pool.h"
#include "kernels/cpu/ops.h"

namespace ds::cpu {

void GatedAttention(const AttnArgs& a) {
  const int hd = a.head_dim;
  const int kvw = a.n_head_kv * hd;
  const int qgw = a.n_head * 2 * hd;
  const int group = a.n_head / a.n_head_kv;
  // Row j of the cache: contiguous, or through the page table.
  auto row = [&a, kvw](int64_t j) -> int64_t {
    if (!a.page_table) return j * kvw;
    return (static_cast<int64_t>(a.page_table[j / a.page_size]) * a.page_size + j % a.page_size) *
           kvw;
  };
  // 1. New K: per-head RMSNorm then rope, written into the cache; V copied as is.
  for (int64_t t = 0; t < a.T; ++t) {
    const int32_t pos = a.pos0 + static_cast<int32_t>(t);
    float* kc = a.k_cache + row(pos);  // [kvw]
    float* vc = a.v_cache + row(pos);
    for (int j = 0; j < a.n_head_kv; ++j) {
      RmsNorm(a.k + t * kvw + j * hd, a.k_norm, hd, a.eps, kc + j * hd);
      RopeNeox(kc + j * hd, a.n_rot, pos, a.rope_base);
    }
    std::memcpy(vc, a.v + t * kvw, sizeof(float) * kvw);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  auto work = [&](int64_t i0, int64_t i1) {
    std::vector<float> q(hd), p;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / a.n_head;
      const int h = static_cast<int>(i % a.n_head);
      const int32_t pos = a.pos0 + static_cast<int32_t>(t);
      const float* qsrc = a.qg + t * qgw + static_cast<int64_t>(h) * 2 * hd;  // [hd] query
      const float* gate = qsrc + hd;                                          // [hd] gate
      RmsNorm(qsrc, a.q_norm, hd, a.eps, q.data());
      RopeNeox(q.data(), a.n_rot, pos, a.rope_base);
      const int kvh = h / group;
      const int64_t n_keys = static_cast<int64_t>(pos) + 1;
      p.assign(n_keys, 0.f);
      float mx = -INFINITY;
      for (int64_t j = 0; j < n_keys; ++j) {
        if (a.valid && !a.valid[j]) {
          p[j] = -INFINITY;
          continue;
        }
        const float* kj = a.k_cache + row(j) + kvh * hd;
        float d = 0.f;
        for (int e = 0; e < hd; ++e) d += q[e] * kj[e];
        p[j] = d * scale;
        mx = std::max(mx, p[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < n_keys; ++j) {
        p[j] = std::isinf(p[j]) && p[j] < 0 ? 0.f : std::exp(p[j] - mx);
        sum += p[j];
      }
      const float inv = sum > 0 ? static_cast<float>(1.0 / sum) : 0.f;
      float* o = a.out + t * (static_cast<int64_t>(a.n_head) * hd) + static_cast<int64_t>(h) * hd;
      for (int e = 0; e < hd; ++e) o[e] = 0.f;
      for (int64_t j = 0; j < n_keys; ++j) {
        if (p[j] == 0.f) continue;
        const float w = p[j] * inv;
        const float* vj = a.v_cache + row(j) + kvh * hd;
        for (int e = 0; e < hd; ++e) o[e] += w * vj[e];
      }
      for (int e = 0; e < hd; ++e) o[e] *= Sigmoid(gate[e]);
    }
  };
  const int64_t n_items = a.T * a.n_head;
  if (a.pool)
    // One item reads ~n_keys rows of K and V: split only when a part gets enough of them.
    a.pool->ParallelFor(n_items, work,
                        std::max<int64_t>(1, (int64_t{1} << 18) /
                                                 std::max<int64_t>(1, int64_t{4} * (a.pos0 + a.T) * hd)));
  else
    work(0, n_items);
}

}  // namespace ds::cpu
