#include "tools/loadgen/loadgen.h"

#include "common/auth/tls.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "deltaserve/v1/deltaserve.grpc.pb.h"

namespace ds::loadgen {
namespace {

namespace v1 = deltaserve::v1;
using Clock = std::chrono::steady_clock;

double Sec(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

const char* CodeName(grpc::StatusCode c) {
  switch (c) {
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    default:
      return "OTHER";
  }
}

struct Samples {
  std::mutex mu;
  std::vector<double> ttft, itl, e2e, srv_queue, srv_ttft, srv_itl, srv_total, tokens_per_step;
  int ok = 0, rejected = 0;
  std::map<std::string, int> errors;
  std::map<std::string, std::string> first_error;
  uint64_t generated = 0, prompt = 0;
  std::vector<uint64_t> drafts_judged, drafts_accepted;  // MTP, summed by draft position
  absl::Status channel_error;  // a client could not build its channel (TLS files)
};

void Client(const LoadOptions& o, int client, std::atomic<int>* next, Samples* out) {
  // One channel (one HTTP/2 connection) per client, as separate clients would have.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt("deltactl.load.client", client);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      auth::MakeChannel(o.addr, o.tls, /*bearer_token=*/"", args);
  if (!channel.ok()) {
    std::lock_guard<std::mutex> l(out->mu);
    out->channel_error = channel.status();
    return;
  }
  auto stub = v1::Generation::NewStub(*channel);
  std::mt19937_64 rng(o.seed * 1000003 + static_cast<uint64_t>(client));
  std::uniform_int_distribution<int32_t> id(0, std::max(1, o.vocab) - 1);
  std::vector<double> itl;
  // The prefix every request shares: the same ids for every client (one RNG seeded by `seed`).
  std::vector<int32_t> shared;
  std::mt19937_64 shared_rng(o.seed ^ 0x5eedULL);
  for (int k = 0; k < o.shared_prefix; ++k) shared.push_back(id(shared_rng));
  while (true) {
    const int i = next->fetch_add(1);
    if (i >= o.requests) return;
    v1::GenerateRequest req;
    for (int32_t t : shared) req.mutable_token_ids()->add_ids(t);
    int len = o.prompt_len;
    if (o.prompt_len_max > o.prompt_len)
      len = std::uniform_int_distribution<int>(o.prompt_len, o.prompt_len_max)(rng);
    for (int k = 0; k < len; ++k) req.mutable_token_ids()->add_ids(id(rng));
    req.set_max_tokens(static_cast<uint32_t>(o.max_tokens));
    req.set_ignore_eos(o.ignore_eos);
    req.mutable_sampling()->set_seed(o.seed + static_cast<uint64_t>(i));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1e3)));
    if (!o.api_key.empty()) ctx.AddMetadata("authorization", "Bearer " + o.api_key);

    const Clock::time_point t0 = Clock::now();
    Clock::time_point last{};
    bool first = true;
    double ttft = 0;
    uint32_t n_tokens = 0;
    itl.clear();
    v1::GenerateResponse msg;
    v1::GenerateResponse::Finished fin;
    bool have_fin = false;
    auto reader = stub->Generate(&ctx, req);
    while (reader->Read(&msg)) {
      if (msg.has_chunk() && msg.chunk().token_ids_size() > 0) {
        const Clock::time_point t = Clock::now();
        const int n = msg.chunk().token_ids_size();
        if (first) {
          ttft = Sec(t - t0);
          first = false;
          // Extra tokens in the first chunk arrived together: zero gaps.
          for (int k = 1; k < n; ++k) itl.push_back(0);
        } else {
          itl.push_back(Sec(t - last) / n);
          for (int k = 1; k < n; ++k) itl.push_back(Sec(t - last) / n);
        }
        last = t;
        n_tokens += static_cast<uint32_t>(n);
      } else if (msg.has_finished()) {
        fin = msg.finished();
        have_fin = true;
      }
    }
    const grpc::Status s = reader->Finish();
    const double e2e = Sec(Clock::now() - t0);
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      {
        std::lock_guard<std::mutex> l(out->mu);
        ++out->rejected;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(o.reject_backoff_ms));
      continue;
    }
    std::lock_guard<std::mutex> l(out->mu);
    if (!s.ok() || !have_fin) {
      const std::string code = CodeName(s.error_code());
      ++out->errors[code];
      // The first message of each code, so the report says why, not only how often.
      if (!out->first_error.count(code))
        out->first_error[code] = s.ok() ? "stream ended without Finished" : s.error_message();
      continue;
    }
    ++out->ok;
    out->generated += n_tokens;
    out->prompt += fin.usage().prompt_tokens();
    if (!first) out->ttft.push_back(ttft);
    out->itl.insert(out->itl.end(), itl.begin(), itl.end());
    out->e2e.push_back(e2e);
    out->srv_queue.push_back(fin.timings().queue_seconds());
    out->srv_ttft.push_back(fin.timings().time_to_first_token_seconds());
    if (fin.usage().completion_tokens() > 1)
      out->srv_itl.push_back(fin.timings().mean_inter_token_seconds());
    out->srv_total.push_back(fin.timings().total_seconds());
    if (fin.timings().tokens_per_step() > 0)
      out->tokens_per_step.push_back(fin.timings().tokens_per_step());
    const auto& judged = fin.timings().drafts_judged();
    const auto& accepted = fin.timings().drafts_accepted();
    if (out->drafts_judged.size() < static_cast<size_t>(judged.size())) {
      out->drafts_judged.resize(judged.size(), 0);
      out->drafts_accepted.resize(judged.size(), 0);
    }
    for (int j = 0; j < judged.size() && j < accepted.size(); ++j) {
      out->drafts_judged[j] += judged[j];
      out->drafts_accepted[j] += accepted[j];
    }
  }
}

}  // namespace

Percentiles Summarize(std::vector<double> v) {
  Percentiles p;
  p.n = v.size();
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  auto rank = [&](double q) {
    const size_t k = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
    return v[std::min(v.size() - 1, k == 0 ? 0 : k - 1)];
  };
  double sum = 0;
  for (double x : v) sum += x;
  p.mean = sum / static_cast<double>(v.size());
  p.p50 = rank(0.50);
  p.p90 = rank(0.90);
  p.p99 = rank(0.99);
  p.max = v.back();
  return p;
}

absl::StatusOr<LoadReport> RunLoad(const LoadOptions& o) {
  if (o.concurrency < 1) return absl::InvalidArgumentError("--concurrency must be >= 1");
  if (o.requests < 1) return absl::InvalidArgumentError("--requests must be >= 1");
  if (o.prompt_len < 1) return absl::InvalidArgumentError("--prompt-len must be >= 1");
  if (o.max_tokens < 1) return absl::InvalidArgumentError("--max-tokens must be >= 1");
  if (o.vocab < 1) return absl::InvalidArgumentError("--vocab must be >= 1");
  Samples s;
  std::atomic<int> next{0};
  const Clock::time_point t0 = Clock::now();
  std::vector<std::thread> clients;
  for (int c = 0; c < o.concurrency; ++c) clients.emplace_back([&, c] { Client(o, c, &next, &s); });
  for (std::thread& t : clients) t.join();
  LoadReport r;
  r.opts = o;
  r.wall_s = Sec(Clock::now() - t0);
  r.ok = s.ok;
  r.rejected = s.rejected;
  if (!s.channel_error.ok()) return s.channel_error;
  r.errors = s.errors;
  r.first_error = s.first_error;
  r.generated_tokens = s.generated;
  r.prompt_tokens = s.prompt;
  r.ttft = Summarize(s.ttft);
  r.itl = Summarize(s.itl);
  r.e2e = Summarize(s.e2e);
  r.srv_queue = Summarize(s.srv_queue);
  r.srv_ttft = Summarize(s.srv_ttft);
  r.srv_itl = Summarize(s.srv_itl);
  r.srv_total = Summarize(s.srv_total);
  r.tokens_per_step = Summarize(s.tokens_per_step);
  r.drafts_judged = s.drafts_judged;
  r.drafts_accepted = s.drafts_accepted;
  return r;
}

std::string FormatReport(const LoadReport& r) {
  auto row = [](const char* name, const Percentiles& p) {
    return absl::StrFormat("  %-26s %9.2f %9.2f %9.2f %9.2f %9.2f  (n=%zu)\n", name, p.p50 * 1e3,
                           p.p90 * 1e3, p.p99 * 1e3, p.mean * 1e3, p.max * 1e3, p.n);
  };
  std::string out = absl::StrFormat(
      "load: %s | concurrency %d, %d requests, prompt %d random ids, max_tokens %d%s\n",
      r.opts.addr, r.opts.concurrency, r.opts.requests, r.opts.prompt_len, r.opts.max_tokens,
      r.opts.ignore_eos ? " (ignore_eos)" : "");
  if (r.opts.shared_prefix > 0 || r.opts.prompt_len_max > r.opts.prompt_len)
    absl::StrAppendFormat(&out, "prompts: a shared prefix of %d ids + %d..%d own ids\n",
                          r.opts.shared_prefix, r.opts.prompt_len,
                          std::max(r.opts.prompt_len, r.opts.prompt_len_max));
  absl::StrAppendFormat(&out, "requests: %d ok, %d rejected (RESOURCE_EXHAUSTED)", r.ok,
                        r.rejected);
  for (const auto& [code, n] : r.errors) absl::StrAppendFormat(&out, ", %d %s", n, code);
  absl::StrAppendFormat(&out, " | wall %.2f s\n", r.wall_s);
  for (const auto& [code, msg] : r.first_error)
    absl::StrAppendFormat(&out, "first %s: %s\n", code, msg);
  absl::StrAppendFormat(&out,
                        "client throughput: %.1f generated tok/s, %.2f req/s (%llu generated, "
                        "%llu prompt tokens)\n",
                        r.wall_s > 0 ? r.generated_tokens / r.wall_s : 0,
                        r.wall_s > 0 ? r.ok / r.wall_s : 0,
                        static_cast<unsigned long long>(r.generated_tokens),
                        static_cast<unsigned long long>(r.prompt_tokens));
  absl::StrAppendFormat(&out, "  %-26s %9s %9s %9s %9s %9s\n", "(milliseconds)", "p50", "p90",
                        "p99", "mean", "max");
  out += "client-side (measured by deltactl, incl. gateway + network):\n";
  out += row("TTFT", r.ttft);
  out += row("inter-token latency", r.itl);
  out += row("end-to-end latency", r.e2e);
  out += "server-side (Finished.timings, measured by the scheduler from request arrival):\n";
  out += row("queue time", r.srv_queue);
  out += row("TTFT (arrival->1st token)", r.srv_ttft);
  out += row("mean inter-token (per req)", r.srv_itl);
  out += row("total (arrival->last token)", r.srv_total);
  // MTP: the mean accepted length per request (1.00 everywhere without MTP).
  const Percentiles& t = r.tokens_per_step;
  if (t.n > 0)
    absl::StrAppendFormat(&out, "  %-26s %9.2f %9.2f %9.2f %9.2f %9.2f  (n=%zu)\n",
                          "tokens per step (MTP)", t.p50, t.p90, t.p99, t.mean, t.max, t.n);
  if (!r.drafts_judged.empty()) {
    out += "MTP acceptance by draft position (accepted / judged, all requests):";
    for (size_t j = 0; j < r.drafts_judged.size(); ++j)
      absl::StrAppendFormat(&out, "  %zu: %.3f (%llu/%llu)", j + 1,
                            r.drafts_judged[j] ? static_cast<double>(r.drafts_accepted[j]) /
                                                     static_cast<double>(r.drafts_judged[j])
                                               : 0.0,
                            static_cast<unsigned long long>(r.drafts_accepted[j]),
                            static_cast<unsigned long long>(r.drafts_judged[j]));
    out += "\n";
  }
  return out;
}

}  // namespace ds::loadgen
