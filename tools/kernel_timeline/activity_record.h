// One activity as the timeline tool records it (from CUPTI's activity records, or built by hand
// in tests): a kernel, a copy or a memset on the device, or a CUDA runtime call on the host.
// Times are nanoseconds of CUPTI's one timebase (device and host activities comparable).
#pragma once

#include <cstdint>
#include <string>

namespace ds::timeline {

enum class ActivityKind { kKernel, kMemcpy, kMemset, kRuntime };

struct ActivityRecord {
  ActivityKind kind = ActivityKind::kKernel;
  std::string name;  // demangled where possible; "memcpy HtoD", "cudaGraphLaunch", ...
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
