// What a kernel timeline says about a CUDA graph's replays: per node (in start order) the median
// duration and the median time the node adds to its replay's span (its end minus the latest end
// of the nodes before it, at least 0); per kernel name the sum of those; per graph the median span.
// Why "added" and not duration: with programmatic dependent launch a kernel starts while the one
// before it runs and waits inside, so durations overlap and their sum overstates the step;
// the added times sum to the span and say which kernels the replay actually waits on.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tools/kernel_timeline/activity_record.h"

namespace ds::timeline {

struct NodeSummary {
  std::string name;
  int grid_x = 0, grid_y = 0, grid_z = 0;
  double duration_us = 0;  // median over replays
  double added_us = 0;     // median over replays
  double start_us = 0;     // median start after the replay's first start
};

struct NameSummary {
  std::string name;
  int nodes = 0;           // nodes of this name per replay
  double added_us = 0;     // sum of their median added times
  double duration_us = 0;  // sum of their median durations
};

// What happens between two replays of a graph (from the end of one to the start of the next):
// per activity outside any graph (kernels, copies, memsets on the device; runtime calls on the
// host), the median over those windows of its time inside the window.
struct BetweenSummary {
  std::string name;
  bool on_host = false;     // a runtime call
  double median_us = 0;     // median time inside a window (0 in windows without it)
  double median_count = 0;  // median number of such activities per window
};

struct GraphSummary {
  uint32_t graph_id = 0;
  int replays = 0;     // replays summarized (complete ones after the skipped first)
  double span_us = 0;  // median of (last end - first start)
  double gap_us = 0;   // median of (this replay's first start - the previous replay's last end)
  std::vector<NodeSummary> nodes;
  std::vector<NameSummary> by_name;  // most added time first
  std::vector<BetweenSummary> between;  // most time first
};

struct SummaryOptions {
  int skip_replays = 2;  // per graph, the first replays (warm-up) are left out
  int min_replays = 3;   // graphs with fewer replays left are not listed
};

// Groups the kernel records of `records` (any order) into the replays of each graph: a replay is
// the records of one graph id between two appearances of the same node id (sorted by start).
// Replays whose node count differs from the graph's most common count (cut by the end of the trace)
// are left out.
std::vector<GraphSummary> SummarizeGraphs(std::vector<ActivityRecord> records,
                                          const SummaryOptions& options);

// A short kernel name for tables: the demangled name without its return type, namespaces,
// template arguments and parameters ("void ds::cuda::(anonymous)::GemvKernel<8, 2>(Args)" ->
// "GemvKernel").
std::string ShortKernelName(const std::string& demangled);

// The summaries as text: one block per graph (span, gap, the names by added time, and with
// `with_nodes` every node).
std::string FormatSummaries(const std::vector<GraphSummary>& graphs, bool with_nodes);

}  // namespace ds::timeline
