// Shared helpers for the model tests: synthesized tiny models and GGUF rewriting (broken files).
#pragma once
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "common/gguf/gguf.h"
#include "tools/synth/synth.h"

namespace ds::testing {

// A fresh path under the test temp dir.
std::string TempPath(const std::string& name);

// Synthesizes (once per process and option set name) and returns the path of a model file.
const std::string& TinyModelPath();          // SynthOptions::Tiny(), F32, tiny BPE, MTP
std::string SynthPath(const std::string& name, const SynthOptions& o);

// Copies `src` to `dst`, letting `edit_kv` drop (return false) or modify metadata entries and
// `edit_tensor` drop (return false) or reshape/retype tensors (bytes are resized to fit: cut or
// zero-extended).
struct TensorEdit {
  std::string name;
  std::vector<int64_t> ne;
  GgmlType type;
};
absl::Status Rewrite(const std::string& src, const std::string& dst,
                     const std::function<bool(const std::string&, gguf::Value&)>& edit_kv,
                     const std::function<bool(TensorEdit&)>& edit_tensor);

// max |x - ref| / max |ref|; infinity when x has a non-finite value or the sizes differ (the
// GPU-vs-CPU bound every device test of the model states its tolerance in).
inline double RelDiff(const std::vector<float>& x, const std::vector<float>& ref) {
  if (x.size() != ref.size() || ref.empty()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) return INFINITY;
    num = std::max(num, std::abs(static_cast<double>(x[i]) - ref[i]));
    den = std::max(den, std::abs(static_cast<double>(ref[i])));
  }
  return num / std::max(den, 1e-30);
}

}  // namespace ds::testing
