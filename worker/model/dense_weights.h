// Whether the CUDA device keeps a 16-bit copy of every layer matrix for its GEMM path
// (`--dense-weights on|off|auto`, CudaBackendOptions::dense_weights, issue #22):
//   off   quantized matrices only; GEMM steps dequantize each matrix into a scratch first
//   on    the copies (~2 bytes per weight more: 45 GiB beside the 27B's 20.6 GiB of Q6_K), and
//         steps past tiled_max_rows rows (batched decode of 33+ sequences) take the GEMM
//   auto  (default) the copies only when they cost the memory plan nothing: the KV pool and the
//         prefix cache stay what they are without them (worker/runner/dense_weights_plan.h);
//         then only steps past the column kernels' row range (prefill pieces of 65+ rows) use
//         them, with the same numbers as dequantization + GEMM, so nothing but the speed changes.
// Header-only so tools that merely forward the flag (serve) can validate it without linking.
#pragma once
#include <optional>
#include <string_view>

namespace ds {

enum class DenseWeights { kOff, kOn, kAuto };

constexpr std::optional<DenseWeights> DenseWeightsFromName(std::string_view name) {
  if (name == "off") return DenseWeights::kOff;
  if (name == "on") return DenseWeights::kOn;
  if (name == "auto") return DenseWeights::kAuto;
  return std::nullopt;
}

// const char* rather than string_view: this absl's StrCat does not take std::string_view.
constexpr const char* DenseWeightsName(DenseWeights d) {
  switch (d) {
    case DenseWeights::kOff:
      return "off";
    case DenseWeights::kOn:
      return "on";
    case DenseWeights::kAuto:
      return "auto";
  }
  return "?";
}

}  // namespace ds
