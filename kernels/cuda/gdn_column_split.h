// Which GDN decode launches split a head's value columns over a thread-block cluster
// (GdnDecodeArgs::column_split, kernels/cuda/gdn.cuh; CudaBackendOptions::gdn_column_split).
// A plain enum with no CUDA types, so the options struct and the programs that set it include it
// freely.
#pragma once
#include <optional>
#include <string_view>

namespace ds::cuda {

// None; the launches of many blocks (batched decode: those that take the whole-head kernel's
// two-per-SM form); every launch (one stream's decode and MTP verify runs too). sm_90+ with dv a
// multiple of 32 and at least 64; elsewhere the whole-head kernels run. The same bits in every
// form (kernels/cuda/README.md "Gated DeltaNet", gdn_launch_cuda_test).
enum class GdnColumnSplit { kOff, kBatched, kAll };

// "off" | "batched" | "all" (`bench --gdn-split`), nullopt for anything else.
inline std::optional<GdnColumnSplit> ParseGdnColumnSplit(std::string_view s) {
  if (s == "off") return GdnColumnSplit::kOff;
  if (s == "batched") return GdnColumnSplit::kBatched;
  if (s == "all") return GdnColumnSplit::kAll;
  return std::nullopt;
}

}  // namespace ds::cuda
