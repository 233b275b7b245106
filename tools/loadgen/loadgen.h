// Closed-loop load generator for the public Generation API (`deltactl load`). `concurrency`
// clients each send one request, wait for its end, and send the next, until `requests` were sent.
// Prompts are random token ids, so any model (with or without a tokenizer) can be loaded.
//
// Two sets of figures are kept apart: client-side (measured here, including the network and the
// gateway) and server-side (Finished.timings, measured by the scheduler).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/auth/tls.h"
#include "common/util/status.h"

namespace ds::loadgen {

struct LoadOptions {
  std::string addr = "127.0.0.1:50051";
  int concurrency = 1;
  int requests = 16;
  int prompt_len = 32;
  // Prefix-cache load (issue #17): every prompt starts with the same shared_prefix random ids
  // (drawn once from `seed`), then its own prompt_len ids, or a length uniform in
  // [prompt_len, prompt_len_max] when prompt_len_max > prompt_len.
  int shared_prefix = 0;
  int prompt_len_max = 0;
  int max_tokens = 32;
  int vocab = 256;  // prompt ids are drawn from [0, vocab)
  uint64_t seed = 1;
  bool ignore_eos = true;  // every request generates exactly max_tokens
  double timeout_s = 300;
  // A client whose request was rejected (RESOURCE_EXHAUSTED) waits this long before its next one,
  // as the public API asks ("retry later with backoff"); the rejected request is not retried.
  int reject_backoff_ms = 20;
  std::string api_key;
  // TLS to the public listener (auth::ClientTlsFiles::tls false: plaintext).
  auth::ClientTlsFiles tls;
};

struct Percentiles {
  size_t n = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};
Percentiles Summarize(std::vector<double> v);  // nearest-rank percentiles

struct LoadReport {
  LoadOptions opts;
  int ok = 0;
  int rejected = 0;                   // RESOURCE_EXHAUSTED (admission)
  std::map<std::string, int> errors;  // other failures by status code name
  std::map<std::string, std::string> first_error;  // code name -> the first such message
  double wall_s = 0;
  uint64_t generated_tokens = 0;
  uint64_t prompt_tokens = 0;
  // Client-side (seconds).
  Percentiles ttft, itl, e2e;
  // Server-side, from Finished.timings (seconds).
  Percentiles srv_queue, srv_ttft, srv_itl, srv_total;
  // Finished.timings.tokens_per_step of each request (1 without MTP; with MTP 1 + the drafts
  // accepted per verify step: the mean accepted length). Not seconds.
  Percentiles tokens_per_step;
  // Finished.timings.drafts_judged / drafts_accepted summed over the requests, by draft position.
  std::vector<uint64_t> drafts_judged, drafts_accepted;
};

absl::StatusOr<LoadReport> RunLoad(const LoadOptions& o);
std::string FormatReport(const LoadReport& r);

}  // namespace ds::loadgen
