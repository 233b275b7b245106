#include "tools/kernel_timeline/timeline_summary.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace ds::timeline {
namespace {

ActivityRecord Kernel(const std::string& name, uint64_t start_us, uint64_t end_us, uint32_t graph,
                      uint64_t node) {
  ActivityRecord r;
  r.name = name;
  r.start_ns = start_us * 1000;
  r.end_ns = end_us * 1000;
  r.graph_id = graph;
  r.graph_node_id = node;
  r.grid_x = 4, r.grid_y = 1, r.grid_z = 1;
  return r;
}

// One replay of a three-node graph at `t` (us): A [t, t+10], B starts early (as with
// programmatic dependent launch) at t+2 and ends at t+10+b, C [t+12+b, t+15+b].
// Before it, outside the graph: an upload on the device [t-6, t-4] and the host's launch call
// [t-3, t-1].
void AddReplay(std::vector<ActivityRecord>& out, uint32_t graph, uint64_t t, uint64_t b) {
  ActivityRecord upload = Kernel("memcpy HtoD", t - 6, t - 4, 0, 0);
  upload.kind = ActivityKind::kMemcpy;
  out.push_back(upload);
  ActivityRecord launch = Kernel("cudaGraphLaunch", t - 3, t - 1, 0, 0);
  launch.kind = ActivityKind::kRuntime;
  out.push_back(launch);
  out.push_back(Kernel("void ds::cuda::(anonymous namespace)::NormKernel<256>(ds::Args)", t, t + 10,
                       graph, 7));
  out.push_back(
      Kernel("void ds::cuda::GemvKernel<8, 2>(ds::GemvArgs)", t + 2, t + 10 + b, graph, 8));
  out.push_back(Kernel("GemvKernel", t + 12 + b, t + 15 + b, graph, 9));
}

TEST(TimelineSummary, MediansOfAddedTimeAndSpanPerGraph) {
  std::vector<ActivityRecord> records;
  // Graph 5: two warm-up replays (slow), then replays with B adding 4, 6, 5 us.
  AddReplay(records, 5, 0, 100);
  AddReplay(records, 5, 200, 100);
  AddReplay(records, 5, 400, 4);
  AddReplay(records, 5, 500, 6);
  AddReplay(records, 5, 600, 5);
  // A kernel outside any graph, and a replay cut by the end of the trace (two nodes only).
  records.push_back(Kernel("Loose", 50, 60, 0, 0));
  records.push_back(Kernel("NormKernel", 700, 710, 5, 7));
  records.push_back(Kernel("GemvKernel", 702, 712, 5, 8));
  // The records arrive in any order.
  std::shuffle(records.begin(), records.end(), std::mt19937(3));

  const std::vector<GraphSummary> graphs = SummarizeGraphs(records, SummaryOptions{});
  ASSERT_EQ(graphs.size(), 1u);
  const GraphSummary& g = graphs[0];
  EXPECT_EQ(g.graph_id, 5u);
  EXPECT_EQ(g.replays, 3);  // 6 replays: 2 skipped, 1 incomplete
  ASSERT_EQ(g.nodes.size(), 3u);
  EXPECT_EQ(g.nodes[0].name, "NormKernel");
  EXPECT_EQ(g.nodes[1].name, "GemvKernel");
  EXPECT_DOUBLE_EQ(g.nodes[0].added_us, 10.0);
  EXPECT_DOUBLE_EQ(g.nodes[1].added_us, 5.0);  // median of 4, 6, 5
  EXPECT_DOUBLE_EQ(g.nodes[1].duration_us, 13.0);
  EXPECT_DOUBLE_EQ(g.nodes[1].start_us, 2.0);
  EXPECT_DOUBLE_EQ(g.nodes[2].added_us, 5.0);  // 2 us of gap + 3 us of kernel
  EXPECT_DOUBLE_EQ(g.span_us, 20.0);           // 15 + median b
  // Gap before a replay: 500 - (415 + 4) = 81 and 600 - 521 = 79 (the replay after the warm-up
  // ones measures against a warm-up replay's end 315: 85); median 81.
  EXPECT_DOUBLE_EQ(g.gap_us, 81.0);
  // By name: GemvKernel's two nodes add 10 us, NormKernel 10 us; the sums equal the span.
  ASSERT_EQ(g.by_name.size(), 2u);
  double sum = 0;
  for (const NameSummary& n : g.by_name) sum += n.added_us;
  EXPECT_DOUBLE_EQ(sum, g.span_us);
  EXPECT_EQ(g.by_name[0].nodes + g.by_name[1].nodes, 3);
  // Between replays: the upload and the launch call, 2 us each, once per window (the loose
  // kernel ran before the first window counted).
  ASSERT_EQ(g.between.size(), 2u);
  for (const BetweenSummary& b : g.between) {
    EXPECT_DOUBLE_EQ(b.median_us, 2.0) << b.name;
    EXPECT_DOUBLE_EQ(b.median_count, 1.0) << b.name;
    EXPECT_EQ(b.on_host, b.name == "cudaGraphLaunch") << b.name;
  }
}

TEST(TimelineSummary, GraphsWithTooFewReplaysAreLeftOut) {
  std::vector<ActivityRecord> records;
  for (int i = 0; i < 4; ++i) AddReplay(records, 1, 100 * i, 3);
  for (int i = 0; i < 6; ++i) AddReplay(records, 2, 1000 + 100 * i, 3);
  SummaryOptions options;
  options.skip_replays = 1;
  options.min_replays = 4;
  const std::vector<GraphSummary> graphs = SummarizeGraphs(records, options);
  ASSERT_EQ(graphs.size(), 1u);
  EXPECT_EQ(graphs[0].graph_id, 2u);
  EXPECT_EQ(graphs[0].replays, 5);
  const std::string text = FormatSummaries(graphs, /*with_nodes=*/true);
  EXPECT_NE(text.find("graph 2: 5 replays, 3 nodes, span 18.0 us"), std::string::npos) << text;
  EXPECT_NE(text.find("GemvKernel"), std::string::npos);
}

TEST(TimelineSummary, ShortKernelNames) {
  EXPECT_EQ(ShortKernelName(
                "void ds::cuda::(anonymous namespace)::GemvKernel<8, (int)2>(ds::cuda::GemvArgs)"),
            "GemvKernel");
  EXPECT_EQ(ShortKernelName("ds::cuda::Argmax(float const*, int)"), "Argmax");
  EXPECT_EQ(ShortKernelName("sm90_xmma_gemm_f16f16_f32"), "sm90_xmma_gemm_f16f16_f32");
  EXPECT_EQ(ShortKernelName("void cutlass::Kernel2<cutlass_80_tensorop<a, b>>(Params)"), "Kernel2");
}

}  // namespace
}  // namespace ds::timeline
