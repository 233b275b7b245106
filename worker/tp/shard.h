// Shard views: cutting one rank's piece out of a full weight tensor of the mmapped GGUF.
//
// Row cuts (column-parallel layers: the rows are output features) select whole quantized rows:
// one contiguous range stays a zero-copy view into the mapping; several ranges (the GDN qkv rows
// q|k|v of the rank's heads) are copied byte for byte, still quantized, into the shard store.
// Column cuts (row-parallel layers: ne0 is the input dimension) keep whole quant blocks when every
// range starts and ends on a block boundary; otherwise the slice is dequantized to f32 at load
// (exact values, 4 bytes/weight). Only the rank's rows/blocks of the mapping are ever read.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/util/status.h"
#include "kernels/cpu/ops.h"
#include "worker/tp/plan.h"

namespace ds::tp {

// Owner of shard bytes that do not live in the mapping (each inner buffer never moves its data).
using ShardStore = std::vector<std::vector<uint8_t>>;

// Cuts a matrix view. `name` only labels errors. *dequantized_bytes (optional) grows by the f32
// bytes of an unaligned column slice.
absl::StatusOr<cpu::WeightView> CutMatrix(const cpu::WeightView& w, const Cut& cut,
                                          const std::string& name, ShardStore* store,
                                          uint64_t* dequantized_bytes = nullptr);

// The same cut applied to an f32 tensor already loaded as [rows, ne0] (conv taps, ssm_a, dt).
absl::StatusOr<std::vector<float>> CutFloats(const std::vector<float>& full, int64_t ne0,
                                             const Cut& cut, const std::string& name);

}  // namespace ds::tp
