// The timeline tool's CUPTI side: a library the CUDA driver loads into any program when
// CUDA_INJECTION64_PATH names it (no change to the program). It records every kernel's device
// start and end through CUPTI's activity API (graph replays included, which ncu times one
// kernel at a time and nsys is not on the device machine to show), every copy and memset, and
// every CUDA runtime call on the host, and at exit writes the
// per-graph summary (timeline_summary.h). This file is a process edge, like a main(): its
// settings come from the environment.
//   DS_TIMELINE_OUT     summary file (default: stderr)
//   DS_TIMELINE_CSV     every record as CSV (name, start, end, graph, node, grid), optional
//   DS_TIMELINE_NODES=1 every node of every graph in the summary, not only the per-name sums
//   DS_TIMELINE_SKIP    replays left out at the start of each graph (default 2)
//   DS_TIMELINE_MAX     records kept at most (default 4,000,000; later ones are counted only)
#include <cupti.h>
#include <cxxabi.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "tools/kernel_timeline/timeline_summary.h"

namespace ds::timeline {
namespace {

constexpr size_t kBufferBytes = 8u << 20;
constexpr size_t kAlign = 8;

std::mutex g_mutex;
std::vector<ActivityRecord>* g_records = nullptr;  // leaked on purpose: used from atexit
size_t g_max_records = 4'000'000;
std::atomic<uint64_t> g_dropped{0};

std::string Demangle(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  char* out = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string result = status == 0 && out != nullptr ? out : name;
  std::free(out);
  return result;
}

std::string MemcpyName(uint8_t copy_kind) {
  switch (copy_kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
      return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
      return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
      return "memcpy DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH:
      return "memcpy HtoH";
    default:
      return "memcpy";
  }
}

// "cudaGraphLaunch_v10000" -> "cudaGraphLaunch".
std::string RuntimeName(CUpti_CallbackId cbid) {
  const char* name = nullptr;
  if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, cbid, &name) != CUPTI_SUCCESS ||
      name == nullptr)
    return "runtime call " + std::to_string(cbid);
  std::string s = name;
  if (const size_t v = s.rfind("_v"); v != std::string::npos && v + 2 < s.size() &&
                                      s.find_first_not_of("0123456789", v + 2) == std::string::npos)
    s.resize(v);
  return s;
}

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kAlign, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::vector<ActivityRecord> batch;
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    ActivityRecord r;
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        r.name = Demangle(k->name);
        r.start_ns = k->start, r.end_ns = k->end;
        r.graph_id = k->graphId, r.graph_node_id = k->graphNodeId;
        r.grid_x = k->gridX, r.grid_y = k->gridY, r.grid_z = k->gridZ;
        r.block_x = k->blockX;
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        r.kind = ActivityKind::kMemcpy;
        r.name = MemcpyName(m->copyKind);
        r.start_ns = m->start, r.end_ns = m->end;
        r.graph_id = m->graphId, r.graph_node_id = m->graphNodeId;
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        r.kind = ActivityKind::kMemset;
        r.name = "memset";
        r.start_ns = m->start, r.end_ns = m->end;
        r.graph_id = m->graphId, r.graph_node_id = m->graphNodeId;
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME: {
        const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(record);
        r.kind = ActivityKind::kRuntime;
        r.name = RuntimeName(a->cbid);
        r.start_ns = a->start, r.end_ns = a->end;
        break;
      }
      default:
        continue;
    }
    batch.push_back(std::move(r));
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(g_mutex);
  for (ActivityRecord& r : batch) {
    if (g_records->size() < g_max_records) {
      g_records->push_back(std::move(r));
    } else {
      ++g_dropped;
    }
  }
}

void WriteCsv(const char* path, const std::vector<ActivityRecord>& records) {
  FILE* f = std::fopen(path, "w");
  if (f == nullptr) {
    std::fprintf(stderr, "kernel timeline: cannot write %s\n", path);
    return;
  }
  std::fprintf(f,
               "kind,name,start_ns,end_ns,graph_id,graph_node_id,grid_x,grid_y,grid_z,block_x\n");
  for (const ActivityRecord& r : records) {
    std::fprintf(f, "%d,\"%s\",%llu,%llu,%u,%llu,%d,%d,%d,%d\n", static_cast<int>(r.kind),
                 ShortKernelName(r.name).c_str(), static_cast<unsigned long long>(r.start_ns),
                 static_cast<unsigned long long>(r.end_ns), r.graph_id,
                 static_cast<unsigned long long>(r.graph_node_id), r.grid_x, r.grid_y, r.grid_z,
                 r.block_x);
  }
  std::fclose(f);
}

void AtExit() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::vector<ActivityRecord> records;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    records.swap(*g_records);
  }
  if (const char* csv = std::getenv("DS_TIMELINE_CSV"); csv != nullptr && *csv != '\0') {
    WriteCsv(csv, records);
  }
  SummaryOptions options;
  if (const char* skip = std::getenv("DS_TIMELINE_SKIP")) options.skip_replays = std::atoi(skip);
  const char* nodes = std::getenv("DS_TIMELINE_NODES");
  const size_t total = records.size();
  std::string text = "kernel timeline: " + std::to_string(total) + " activities recorded, " +
                     std::to_string(g_dropped.load()) + " past the limit\n";
  text += FormatSummaries(SummarizeGraphs(std::move(records), options),
                          nodes != nullptr && std::strcmp(nodes, "1") == 0);
  const char* out = std::getenv("DS_TIMELINE_OUT");
  FILE* f = out != nullptr && *out != '\0' ? std::fopen(out, "w") : stderr;
  if (f == nullptr) f = stderr;
  std::fputs(text.c_str(), f);
  if (f != stderr) std::fclose(f);
}

}  // namespace
}  // namespace ds::timeline

// Called by the CUDA driver at cuInit when CUDA_INJECTION64_PATH names this library.
extern "C" int InitializeInjection(void) {
  using namespace ds::timeline;
  g_records = new std::vector<ActivityRecord>();
  if (const char* max = std::getenv("DS_TIMELINE_MAX"))
    g_max_records = std::strtoull(max, nullptr, 10);
  if (cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "kernel timeline: CUPTI refused the kernel activity; nothing recorded\n");
    return 0;
  }
  std::atexit(AtExit);
  return 1;
}
