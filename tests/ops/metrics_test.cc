// common/metrics: naming conventions over every family, the behaviour of each component's
// metrics, the /metrics endpoint over real HTTP, and the NVML sampler (fake library on CI, the
// real one where a driver is installed).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <sys/socket.h>

#include <cmath>
#include <map>
#include <regex>
#include <string>

#include "common/metrics/gateway_metrics.h"
#include "common/metrics/metrics_server.h"
#include "common/metrics/nvml.h"
#include "common/metrics/scheduler_metrics.h"
#include "common/metrics/worker_metrics.h"
#include "tests/ops/http_get.h"

namespace ds::metrics {
namespace {

// Value of the series `name{labels}` exactly as written in the exposition text, NaN if absent.
double Value(const std::string& text, const std::string& series) {
  const std::string prefix = series + " ";
  size_t p = 0;
  while ((p = text.find(prefix, p)) != std::string::npos) {
    if (p == 0 || text[p - 1] == '\n') return std::stod(text.substr(p + prefix.size()));
    p += prefix.size();
  }
  return std::nan("");
}

std::unique_ptr<MetricsServer> Local() {
  auto s = MetricsServer::Start("", "test");
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(*s);
}

TEST(MetricNames, EveryFamilyFollowsTheConventions) {
  auto s = Local();
  GatewayMetrics g(s->registry(), 64);
  SchedulerMetrics sc(s->registry());
  sc.SetWorker("w0", true, 0.5);
  SchedulerGaugeState st;
  st.per_slot.resize(2);
  sc.Update(st);
  WorkerMetrics w(s->registry(), "w0");
  int n = 0;
  for (const prometheus::MetricFamily& f : s->registry().Collect()) {
    const bool counter = f.type == prometheus::MetricType::Counter;
    const bool histogram = f.type == prometheus::MetricType::Histogram;
    EXPECT_TRUE(CheckMetricName(f.name, counter, histogram).ok())
        << CheckMetricName(f.name, counter, histogram);
    EXPECT_FALSE(f.help.empty()) << f.name;
    // Small closed label sets: no family may carry more than a handful of label names.
    for (const auto& m : f.metric) EXPECT_LE(m.label.size(), 3u) << f.name;
    ++n;
  }
  EXPECT_GE(n, 35);
  EXPECT_FALSE(CheckMetricName("deltaserve_latency_ms", false, false).ok());
  EXPECT_FALSE(CheckMetricName("deltaserve_requests", true, false).ok());
  EXPECT_FALSE(CheckMetricName("deltaserve_slots_total", false, false).ok());
  EXPECT_FALSE(CheckMetricName("vllm_requests_total", true, false).ok());
  EXPECT_FALSE(CheckMetricName("deltaserve_step_time", false, true).ok());
}

TEST(GatewayMetricsTest, OutcomesExistFromTheStartAndCountOnce) {
  auto s = Local();
  GatewayMetrics g(s->registry(), 8);
  std::string t = s->Scrape();
  for (const char* o : {"success", "cancelled", "deadline_exceeded", "rejected", "invalid_argument",
                        "unauthenticated", "unavailable", "error"})
    EXPECT_EQ(Value(t, std::string("deltaserve_requests_total{outcome=\"") + o + "\"}"), 0) << o;
  EXPECT_EQ(Value(t, "deltaserve_gateway_requests_inflight_limit"), 8);
  {
    GatewayMetrics::Request r(&g);
    r.Admitted(0.01, 12);
    for (int i = 0; i < 5; ++i) r.Token();
    r.Finish(absl::OkStatus());
    r.Finish(Outcome::kError);  // ignored: one outcome per request
  }
  { GatewayMetrics::Request r(&g); }  // returned without Finish: counted as error
  {
    GatewayMetrics::Request r(&g);
    r.Finish(absl::UnauthenticatedError("no token"));
  }
  t = s->Scrape();
  EXPECT_EQ(Value(t, "deltaserve_requests_total{outcome=\"success\"}"), 1);
  EXPECT_EQ(Value(t, "deltaserve_requests_total{outcome=\"error\"}"), 1);
  EXPECT_EQ(Value(t, "deltaserve_requests_total{outcome=\"unauthenticated\"}"), 1);
  EXPECT_EQ(Value(t, "deltaserve_prompt_tokens_total"), 12);
  EXPECT_EQ(Value(t, "deltaserve_generation_tokens_total"), 5);
  EXPECT_EQ(Value(t, "deltaserve_time_to_first_token_seconds_count"), 1);
  EXPECT_EQ(Value(t, "deltaserve_inter_token_latency_seconds_count"), 4);
  EXPECT_EQ(Value(t, "deltaserve_queue_wait_seconds_count"), 1);
  EXPECT_EQ(Value(t, "deltaserve_request_duration_seconds_count"), 1)
      << "only successful requests feed the latency histogram";
  // The latency objective (monitoring/rules) reads this exact bucket label.
  EXPECT_NE(t.find("deltaserve_time_to_first_token_seconds_bucket{le=\"2.5\"}"), std::string::npos)
      << t;
  EXPECT_EQ(OutcomeFromStatus(absl::StatusCode::kResourceExhausted), Outcome::kRejected);
  EXPECT_EQ(OutcomeFromStatus(absl::StatusCode::kPermissionDenied), Outcome::kUnauthenticated);
  EXPECT_EQ(OutcomeFromStatus(absl::StatusCode::kDataLoss), Outcome::kError);
}

TEST(SchedulerMetricsTest, GaugesSlotsAndWorkers) {
  auto s = Local();
  SchedulerMetrics m(s->registry());
  SchedulerGaugeState st;
  st.waiting = 3;
  st.running = 2;
  st.queue_capacity = 256;
  st.slots = 4;
  st.slots_busy = 2;
  st.context_used = 300;
  st.context_reserved = 1024;
  st.context_capacity = 4096;
  st.serving = true;
  st.per_slot = {{100, 512, 4096, true}, {200, 512, 4096, true}, {}, {}};
  m.Update(st);
  m.OnStep(0.02, 130, 2, 0.015);
  m.OnStep(0.01, 2, 2, 0.009, /*ahead=*/true);
  m.SetWorker("host-gpu0", true, 0.4);
  std::string t = s->Scrape();
  EXPECT_EQ(Value(t, "deltaserve_requests_waiting"), 3);
  EXPECT_EQ(Value(t, "deltaserve_requests_running"), 2);
  EXPECT_EQ(Value(t, "deltaserve_context_usage_ratio"), 0.25);
  EXPECT_EQ(Value(t, "deltaserve_slot_context_used_tokens{slot=\"1\"}"), 200);
  EXPECT_EQ(Value(t, "deltaserve_slot_context_capacity_tokens{slot=\"3\"}"), 0);
  EXPECT_EQ(Value(t, "deltaserve_step_batch_tokens_sum"), 132);
  EXPECT_EQ(Value(t, "deltaserve_step_tokens_total"), 132);
  EXPECT_EQ(Value(t, "deltaserve_steps_total"), 2);
  EXPECT_EQ(Value(t, "deltaserve_steps_ahead_total"), 1);
  EXPECT_EQ(Value(t, "deltaserve_worker_up{worker=\"host-gpu0\"}"), 1);
  // Shrink to 2 slots: series of slots 2 and 3 go away. The worker is lost: up=0, kept.
  st.per_slot.resize(2);
  m.Update(st);
  m.SetWorker("host-gpu0", false, 12);
  t = s->Scrape();
  EXPECT_TRUE(std::isnan(Value(t, "deltaserve_slot_context_used_tokens{slot=\"2\"}")));
  EXPECT_EQ(Value(t, "deltaserve_slot_context_used_tokens{slot=\"0\"}"), 100);
  EXPECT_EQ(Value(t, "deltaserve_worker_up{worker=\"host-gpu0\"}"), 0);
  EXPECT_EQ(Value(t, "deltaserve_worker_heartbeat_age_seconds{worker=\"host-gpu0\"}"), 12);
}

TEST(WorkerMetricsTest, MemoryKindsAndSteps) {
  auto s = Local();
  WorkerMetrics w(s->registry(), "h-gpu1");
  w.SetMemory(MemoryKind::kWeights, 1000);
  w.SetMemory(MemoryKind::kRecurrentState, 7);
  w.OnStep(0.01, 0.001, 64, false);
  w.OnStep(0, 0, 0, true);
  const std::string t = s->Scrape();
  EXPECT_EQ(Value(t, "deltaserve_worker_memory_bytes{worker=\"h-gpu1\",kind=\"weights\"}"), 1000);
  EXPECT_EQ(Value(t, "deltaserve_worker_memory_bytes{worker=\"h-gpu1\",kind=\"recurrent_state\"}"),
            7);
  EXPECT_EQ(Value(t, "deltaserve_worker_memory_bytes{worker=\"h-gpu1\",kind=\"kv\"}"), 0);
  EXPECT_EQ(Value(t, "deltaserve_worker_steps_total{worker=\"h-gpu1\"}"), 2);
  EXPECT_EQ(Value(t, "deltaserve_worker_step_errors_total{worker=\"h-gpu1\"}"), 1);
  EXPECT_EQ(Value(t, "deltaserve_worker_forward_seconds_count{worker=\"h-gpu1\"}"), 1);
}

TEST(MetricsServerTest, ServesOverHttpOnLoopbackAndRunsHooks) {
  auto s = MetricsServer::Start("127.0.0.1:0", "gateway");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_GT((*s)->port(), 0);
  auto& g =
      prometheus::BuildGauge().Name("deltaserve_test_hooked").Help("h").Register((*s)->registry());
  auto& v = g.Add({});
  int calls = 0;
  (*s)->AddCollectHook([&] { v.Set(++calls); });
  int status = 0;
  const std::string body = testing::HttpGet((*s)->port(), "/metrics", &status);
  EXPECT_EQ(status, 200);
  EXPECT_NE(body.find("deltaserve_build_info{component=\"gateway\"} 1"), std::string::npos) << body;
  EXPECT_NE(body.find("deltaserve_test_hooked 1"), std::string::npos) << body;
  EXPECT_NE(body.find("# TYPE deltaserve_start_time_seconds gauge"), std::string::npos);
  // A second server on the same port fails with a status, not an exception.
  auto clash = MetricsServer::Start("127.0.0.1:" + std::to_string((*s)->port()), "x");
  EXPECT_FALSE(clash.ok());
  EXPECT_FALSE(MetricsServer::Start("no-port", "x").ok());
}

TEST(NvmlTest, MissingLibraryIsAReasonNotACrash) {
  auto n = Nvml::Load("libnvidia-ml-does-not-exist.so.1");
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.status().message().find("libnvidia-ml-does-not-exist"), std::string::npos);
  auto s = Local();
  WorkerMetrics w(s->registry(), "w");
  EXPECT_FALSE(
      w.StartGpuSampling({0}, std::chrono::milliseconds(100), "libnvidia-ml-does-not-exist.so.1")
          .ok());
  EXPECT_EQ(s->Scrape().find("deltaserve_gpu_"), std::string::npos)
      << "without NVML the GPU metrics are not exported at all";
}

TEST(NvmlTest, FakeLibraryThroughTheRealDlopenPath) {
  auto s = Local();
  WorkerMetrics w(s->registry(), "h-gpu1");
  // GPU 5 does not exist: nothing registered.
  EXPECT_FALSE(w.StartGpuSampling({5}, std::chrono::milliseconds(50), DS_FAKE_NVML).ok());
  EXPECT_EQ(s->Scrape().find("deltaserve_gpu_"), std::string::npos);
  ASSERT_TRUE(w.StartGpuSampling({1}, std::chrono::milliseconds(50), DS_FAKE_NVML).ok());
  const std::string t = s->Scrape();
  EXPECT_DOUBLE_EQ(Value(t, "deltaserve_gpu_utilization_ratio{worker=\"h-gpu1\",gpu=\"1\"}"), 0.38);
  EXPECT_EQ(Value(t, "deltaserve_gpu_memory_used_bytes{worker=\"h-gpu1\",gpu=\"1\"}"),
            (3ull << 30) + 1);
  EXPECT_EQ(Value(t, "deltaserve_gpu_memory_total_bytes{worker=\"h-gpu1\",gpu=\"1\"}"),
            80ull << 30);
}

TEST(NvmlTest, RealLibraryWhenADriverIsInstalled) {
  void* h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!h) h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  if (!h) GTEST_SKIP() << "no NVIDIA driver here (libnvidia-ml.so.1 not found)";
  dlclose(h);
  auto n = Nvml::Load();
  ASSERT_TRUE(n.ok()) << n.status();
  auto count = (*n)->DeviceCount();
  ASSERT_TRUE(count.ok()) << count.status();
  ASSERT_GE(*count, 1);
  auto name = (*n)->DeviceName(0);
  ASSERT_TRUE(name.ok()) << name.status();
  auto sample = (*n)->Sample(0);
  ASSERT_TRUE(sample.ok()) << sample.status();
  EXPECT_GT(sample->memory_total_bytes, 1ull << 30) << *name;
  EXPECT_LE(sample->memory_used_bytes, sample->memory_total_bytes);
  EXPECT_GE(sample->utilization_ratio, 0.0);
  EXPECT_LE(sample->utilization_ratio, 1.0);
  std::printf("NVML: %d GPU(s); GPU 0 %s, %.1f GiB used of %.1f GiB, utilization %.0f%%\n", *count,
              name->c_str(), sample->memory_used_bytes / 1073741824.0,
              sample->memory_total_bytes / 1073741824.0, sample->utilization_ratio * 100);
}

}  // namespace
}  // namespace ds::metrics
