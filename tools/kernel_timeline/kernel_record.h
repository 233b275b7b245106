// One kernel execution as the timeline tool records it (from CUPTI's kernel activity records,
// or built by hand in tests). Times are the device's nanoseconds.
#pragma once

#include <cstdint>
#include <string>

namespace ds::timeline {

struct KernelRecord {
  std::string name;  // demangled where possible
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
  // 0 for a kernel launched outside a CUDA graph; else the graph's id and this node's id in it
  // (the same for every launch of one instantiated graph).
  uint32_t graph_id = 0;
  uint64_t graph_node_id = 0;
  int grid_x = 0, grid_y = 0, grid_z = 0;
  int block_x = 0;
};

}  // namespace ds::timeline
