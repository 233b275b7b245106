#include "tools/kernel_timeline/timeline_summary.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

namespace ds::timeline {
namespace {

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

using Replay = std::vector<const ActivityRecord*>;  // one graph replay, by start

// Splits one graph's records (sorted by start) into replays.
std::vector<Replay> SplitReplays(const std::vector<const ActivityRecord*>& sorted) {
  std::vector<Replay> replays;
  std::set<uint64_t> seen;
  for (const ActivityRecord* r : sorted) {
    if (replays.empty() || seen.count(r->graph_node_id) != 0) {
      replays.emplace_back();
      seen.clear();
    }
    seen.insert(r->graph_node_id);
    replays.back().push_back(r);
  }
  return replays;
}

int MostCommonSize(const std::vector<Replay>& replays) {
  std::map<size_t, int> counts;
  for (const Replay& r : replays) ++counts[r.size()];
  size_t best = 0;
  int best_count = 0;
  for (const auto& [size, count] : counts) {
    if (count > best_count) best = size, best_count = count;
  }
  return static_cast<int>(best);
}

// Per name, the median over the windows between replays of the time its activities outside
// graphs spend inside the window. `loose` is sorted by start.
std::vector<BetweenSummary> SummarizeBetween(
    const std::vector<std::pair<uint64_t, uint64_t>>& windows,
    const std::vector<const ActivityRecord*>& loose) {
  std::map<std::string, std::vector<double>> times, counts;
  std::map<std::string, bool> on_host;
  uint64_t longest = 0;
  for (const ActivityRecord* r : loose) longest = std::max(longest, r->end_ns - r->start_ns);
  for (size_t w = 0; w < windows.size(); ++w) {
    const auto [lo, hi] = windows[w];
    // Activities starting before lo - longest cannot reach into the window.
    auto it = std::lower_bound(loose.begin(), loose.end(), lo > longest ? lo - longest : 0,
                               [](const ActivityRecord* r, uint64_t t) { return r->start_ns < t; });
    for (; it != loose.end() && (*it)->start_ns < hi; ++it) {
      const ActivityRecord& r = **it;
      const uint64_t a = std::max(r.start_ns, lo), b = std::min(r.end_ns, hi);
      if (b <= a && !(r.start_ns >= lo && r.start_ns < hi)) continue;
      auto& t = times[r.name];
      auto& c = counts[r.name];
      t.resize(windows.size(), 0.0);
      c.resize(windows.size(), 0.0);
      t[w] += b > a ? (b - a) * 1e-3 : 0.0;
      c[w] += 1;
      on_host[r.name] = r.kind == ActivityKind::kRuntime;
    }
  }
  std::vector<BetweenSummary> out;
  for (auto& [name, t] : times)
    out.push_back({name, on_host[name], Median(t), Median(counts[name])});
  std::stable_sort(out.begin(), out.end(), [](const BetweenSummary& a, const BetweenSummary& b) {
    return a.median_us > b.median_us;
  });
  return out;
}

GraphSummary SummarizeOne(uint32_t graph_id, const std::vector<Replay>& all,
                          const SummaryOptions& options,
                          const std::vector<const ActivityRecord*>& loose) {
  GraphSummary g;
  g.graph_id = graph_id;
  const size_t size = static_cast<size_t>(MostCommonSize(all));
  std::vector<const Replay*> kept;
  std::vector<double> gaps;
  std::vector<std::pair<uint64_t, uint64_t>> windows;
  for (size_t i = 0; i < all.size(); ++i) {
    if (static_cast<int>(i) < options.skip_replays || all[i].size() != size) continue;
    kept.push_back(&all[i]);
    if (i > 0) {
      uint64_t prev_end = 0;
      for (const ActivityRecord* r : all[i - 1]) prev_end = std::max(prev_end, r->end_ns);
      const uint64_t first = all[i].front()->start_ns;
      gaps.push_back(first >= prev_end ? (first - prev_end) * 1e-3 : 0.0);
      if (first > prev_end) windows.emplace_back(prev_end, first);
    }
  }
  g.replays = static_cast<int>(kept.size());
  if (kept.empty()) return g;
  g.gap_us = Median(gaps);
  g.between = SummarizeBetween(windows, loose);
  std::vector<double> spans;
  std::vector<std::vector<double>> durations(size), added(size), starts(size);
  for (const Replay* replay : kept) {
    const uint64_t first = replay->front()->start_ns;
    uint64_t latest_end = first;
    for (size_t k = 0; k < size; ++k) {
      const ActivityRecord& r = *(*replay)[k];
      durations[k].push_back((r.end_ns - r.start_ns) * 1e-3);
      starts[k].push_back((r.start_ns - first) * 1e-3);
      added[k].push_back(r.end_ns > latest_end ? (r.end_ns - latest_end) * 1e-3 : 0.0);
      latest_end = std::max(latest_end, r.end_ns);
    }
    spans.push_back((latest_end - first) * 1e-3);
  }
  g.span_us = Median(spans);
  std::map<std::string, NameSummary> by_name;
  for (size_t k = 0; k < size; ++k) {
    const ActivityRecord& r = *(*kept.front())[k];
    NodeSummary node{ShortKernelName(r.name), r.grid_x,         r.grid_y,         r.grid_z,
                     Median(durations[k]),    Median(added[k]), Median(starts[k])};
    NameSummary& n = by_name[node.name];
    n.name = node.name;
    ++n.nodes;
    n.added_us += node.added_us;
    n.duration_us += node.duration_us;
    g.nodes.push_back(std::move(node));
  }
  for (auto& [name, n] : by_name) g.by_name.push_back(n);
  std::stable_sort(
      g.by_name.begin(), g.by_name.end(),
      [](const NameSummary& a, const NameSummary& b) { return a.added_us > b.added_us; });
  return g;
}

}  // namespace

std::vector<GraphSummary> SummarizeGraphs(std::vector<ActivityRecord> records,
                                          const SummaryOptions& options) {
  std::map<uint32_t, std::vector<const ActivityRecord*>> per_graph;
  std::vector<const ActivityRecord*> loose;  // outside every graph
  for (const ActivityRecord& r : records) {
    if (r.graph_id != 0 && r.kind == ActivityKind::kKernel) {
      per_graph[r.graph_id].push_back(&r);
    } else if (r.graph_id == 0) {
      loose.push_back(&r);
    }
  }
  std::stable_sort(
      loose.begin(), loose.end(),
      [](const ActivityRecord* a, const ActivityRecord* b) { return a->start_ns < b->start_ns; });
  std::vector<GraphSummary> out;
  for (auto& [id, list] : per_graph) {
    std::stable_sort(
        list.begin(), list.end(),
        [](const ActivityRecord* a, const ActivityRecord* b) { return a->start_ns < b->start_ns; });
    GraphSummary g = SummarizeOne(id, SplitReplays(list), options, loose);
    if (g.replays >= options.min_replays) out.push_back(std::move(g));
  }
  return out;
}

std::string ShortKernelName(const std::string& demangled) {
  std::string s = demangled;
  const std::string anonymous = "(anonymous namespace)";
  for (size_t at; (at = s.find(anonymous)) != std::string::npos;)
    s.replace(at, anonymous.size(), "anon");
  // Up to the parameter list (the first '(' outside template brackets), without template arguments.
  std::string head;
  int depth = 0;
  for (char c : s) {
    if (c == '(' && depth == 0) break;
    if (c == '<') ++depth;
    if (depth == 0) head += c;
    if (c == '>') --depth;
  }
  // Without the return type and the qualifiers.
  if (const size_t space = head.rfind(' '); space != std::string::npos)
    head = head.substr(space + 1);
  if (const size_t colons = head.rfind("::"); colons != std::string::npos)
    head = head.substr(colons + 2);
  return head.empty() ? demangled : head;
}

std::string FormatSummaries(const std::vector<GraphSummary>& graphs, bool with_nodes) {
  std::string out;
  char line[512];
  for (const GraphSummary& g : graphs) {
    std::snprintf(
        line, sizeof line,
        "graph %u: %d replays, %zu nodes, span %.1f us (median), gap before a replay %.1f us\n",
        g.graph_id, g.replays, g.nodes.size(), g.span_us, g.gap_us);
    out += line;
    std::snprintf(line, sizeof line, "  %-40s %5s %10s %10s\n", "kernel", "nodes", "added us",
                  "dur us");
    out += line;
    for (const NameSummary& n : g.by_name) {
      std::snprintf(line, sizeof line, "  %-40.40s %5d %10.1f %10.1f\n", n.name.c_str(), n.nodes,
                    n.added_us, n.duration_us);
      out += line;
    }
    if (!g.between.empty()) {
      std::snprintf(line, sizeof line, "  between replays (median per window):%s\n", "");
      out += line;
      for (size_t i = 0; i < g.between.size() && i < 16; ++i) {
        const BetweenSummary& b = g.between[i];
        std::snprintf(line, sizeof line, "    %-4s %-34.34s %7.1f us  x%.0f\n",
                      b.on_host ? "host" : "dev", b.name.c_str(), b.median_us, b.median_count);
        out += line;
      }
    }
    if (!with_nodes) continue;
    std::snprintf(line, sizeof line, "  %4s %-40s %14s %9s %9s %9s\n", "#", "node", "grid",
                  "start us", "dur us", "added us");
    out += line;
    for (size_t k = 0; k < g.nodes.size(); ++k) {
      const NodeSummary& n = g.nodes[k];
      char grid[48];
      std::snprintf(grid, sizeof grid, "%dx%dx%d", n.grid_x, n.grid_y, n.grid_z);
      std::snprintf(line, sizeof line, "  %4zu %-40.40s %14s %9.1f %9.1f %9.1f\n", k,
                    n.name.c_str(), grid, n.start_us, n.duration_us, n.added_us);
      out += line;
    }
  }
  return out;
}

}  // namespace ds::timeline
