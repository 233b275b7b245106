// Benchmark (not a test): the per-token cost of response_format json_object masks on a real-size
// vocabulary, the Qwen3 one of the npm reference tokenizer (tests/tokenizer/prepare_npm.sh <dir>
// writes <dir>/qwen3_vocab.json). Optionally padded to Qwen3.5's 248,320 ids with extra tokens
// made of pairs of existing ones (--pad-to N), as the 27B's larger vocabulary would have.
//
//   json_constraint_bench <dir>/qwen3_vocab.json [--pad-to 248320] [--docs 20]
//
// It builds the JsonVocab (trie) once, then "generates" JSON documents token by token (the
// documents are tokenized by greedy longest match over the vocabulary), timing per token
// Mask() over a full logits row + Accept(). Reported: build time, trie nodes, the cost of a
// mask computed by the trie walk (cache miss), the cost per token over whole documents (cold
// cache for the first document, then warm), and the masking pass alone. Figures go to
// docs/perf/cpu.md.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/sampling/json_constraint.h"
#include "common/sampling/rng.h"
#include "common/tokenizer/byte_level.h"

namespace {

// Thread CPU time: the 2-core machine is shared, and wall time would count other work.
struct Clock {
  using time_point = double;
  static double now() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
  }
};
double Us(double a, double b) { return b - a; }

// A document of the kind a json_object answer holds: nested objects and arrays, prose strings
// with escapes and non-ASCII, numbers of every shape, pretty-printed or compact.
std::string Document(uint64_t seed) {
  ds::sampling::Rng rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng.Next() % static_cast<uint64_t>(n)); };
  const char* words[] = {"the",
                         "weather",
                         "in",
                         "Paris",
                         "is",
                         "sunny",
                         "and",
                         "warm",
                         "r\u00e9sum\u00e9",
                         "\u6771\u4eac",
                         "data",
                         "value",
                         "\\\"quoted\\\"",
                         "line\\nbreak",
                         "42"};
  nlohmann::ordered_json o = nlohmann::ordered_json::object();
  std::function<nlohmann::ordered_json(int)> value = [&](int depth) -> nlohmann::ordered_json {
    switch (depth > 3 ? pick(4) : pick(6)) {
      case 0: {
        std::string s;
        for (int i = 3 + pick(12); i > 0; --i)
          s += std::string(s.empty() ? "" : " ") + words[pick(15)];
        return s;
      }
      case 1:
        return pick(1000) - 500;
      case 2:
        return (pick(20000) - 10000) / 64.0;
      case 3:
        return pick(3) == 0 ? nlohmann::ordered_json(nullptr)
                            : nlohmann::ordered_json(pick(2) == 1);
      case 4: {
        auto a = nlohmann::ordered_json::array();
        for (int i = 1 + pick(5); i > 0; --i) a.push_back(value(depth + 1));
        return a;
      }
      default: {
        auto m = nlohmann::ordered_json::object();
        for (int i = 1 + pick(5); i > 0; --i)
          m[std::string(words[pick(8)]) + std::to_string(i)] = value(depth + 1);
        return m;
      }
    }
  };
  for (int i = 0; i < 8; ++i) o["field_" + std::to_string(i)] = value(1);
  return pick(2) ? o.dump(2) : o.dump();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s qwen3_vocab.json [--pad-to N] [--docs N]\n", argv[0]);
    return 2;
  }
  size_t pad_to = 0;
  int n_docs = 20;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--pad-to") pad_to = std::stoul(argv[i + 1]);
    if (std::string(argv[i]) == "--docs") n_docs = std::stoi(argv[i + 1]);
  }
  std::ifstream in(argv[1], std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const nlohmann::json v = nlohmann::json::parse(ss.str(), nullptr, false);
  if (v.is_discarded()) {
    std::fprintf(stderr, "cannot read %s\n", argv[1]);
    return 1;
  }
  // HF byte-level token strings -> raw bytes; added (special) tokens have no text here, and
  // <|im_end|> / <|endoftext|> end generation, as the worker builds it from the GGUF.
  size_t n = 0;
  for (const auto& [tok, id] : v["vocab"].items()) n = std::max<size_t>(n, id.get<size_t>() + 1);
  for (const auto& a : v["added_tokens"]) n = std::max<size_t>(n, a["id"].get<size_t>() + 1);
  std::vector<std::string> bytes(n);
  for (const auto& [tok, id] : v["vocab"].items())
    if (auto b = ds::tok::Gpt2ToBytes(tok)) bytes[id.get<size_t>()] = *b;
  std::vector<int32_t> end_ids;
  for (const auto& a : v["added_tokens"]) {
    const std::string c = a["content"].get<std::string>();
    if (c == "<|im_end|>" || c == "<|endoftext|>") end_ids.push_back(a["id"].get<int32_t>());
  }
  const size_t n_real = n;
  if (pad_to > n) {
    ds::sampling::Rng rng(1);
    while (bytes.size() < pad_to) {
      const std::string& a = bytes[rng.Next() % n_real];
      const std::string& b = bytes[rng.Next() % n_real];
      bytes.push_back(a.empty() || b.empty() ? std::string() : a + b);
    }
  }
  auto t0 = Clock::now();
  auto vocab = std::make_shared<ds::sampling::JsonVocab>(bytes, end_ids);
  auto t1 = Clock::now();
  std::printf("vocab: %zu ids (%zu from %s), %zu trie nodes, built in %.1f ms\n", bytes.size(),
              n_real, argv[1], vocab->n_nodes(), Us(t0, t1) / 1000);

  // Greedy longest-match tokenization of a document (the benchmark's "model output").
  size_t max_len = 0;
  std::unordered_map<std::string, int32_t> by_bytes;
  for (size_t i = 0; i < n_real; ++i)
    if (!bytes[i].empty()) {
      by_bytes.emplace(bytes[i], static_cast<int32_t>(i));
      max_len = std::max(max_len, bytes[i].size());
    }
  auto tokenize = [&](const std::string& s) {
    std::vector<int32_t> ids;
    for (size_t p = 0; p < s.size();) {
      for (size_t l = std::min(max_len, s.size() - p); l > 0; --l)
        if (auto it = by_bytes.find(s.substr(p, l)); it != by_bytes.end()) {
          ids.push_back(it->second);
          p += l;
          break;
        }
    }
    return ids;
  };

  std::vector<float> logits(bytes.size(), 0.5f);
  // Mask computed by the trie walk: every token of one document with the cache cleared each time.
  {
    const std::vector<int32_t> ids = tokenize(Document(1));
    ds::sampling::JsonConstraint c(vocab);
    double total = 0, worst = 0;
    for (int32_t id : ids) {
      vocab->ClearCache();
      auto a = Clock::now();
      c.Mask(logits);
      auto b = Clock::now();
      total += Us(a, b);
      worst = std::max(worst, Us(a, b));
      if (!c.Accept(id).ok()) {
        std::fprintf(stderr, "document token %d refused\n", id);
        return 1;
      }
    }
    std::printf(
        "uncached mask (trie walk + masking): mean %.0f us, worst %.0f us over %zu tokens\n",
        total / ids.size(), worst, ids.size());
  }
  vocab->ClearCache();
  // Whole documents as a generation sees them: the first with an empty cache, then warm.
  double cold = 0, warm = 0;
  size_t cold_tokens = 0, warm_tokens = 0;
  const uint64_t misses0 = vocab->misses();
  for (int d = 0; d < n_docs; ++d) {
    const std::string doc = Document(100 + d);
    const std::vector<int32_t> ids = tokenize(doc);
    ds::sampling::JsonConstraint c(vocab);
    auto a = Clock::now();
    for (int32_t id : ids) {
      c.Mask(logits);
      if (!c.Accept(id).ok()) {
        std::fprintf(stderr, "document %d: token %d refused\n", d, id);
        return 1;
      }
    }
    c.Mask(logits);  // the EOS step
    auto b = Clock::now();
    if (!c.complete()) {
      std::fprintf(stderr, "document %d incomplete\n", d);
      return 1;
    }
    (d == 0 ? cold : warm) += Us(a, b);
    (d == 0 ? cold_tokens : warm_tokens) += ids.size() + 1;
  }
  std::printf("per token, first document (cold cache): %.1f us over %zu tokens\n",
              cold / cold_tokens, cold_tokens);
  std::printf(
      "per token, next %d documents (warm): %.1f us over %zu tokens; %llu masks computed in all\n",
      n_docs - 1, warm / std::max<size_t>(warm_tokens, 1), warm_tokens,
      static_cast<unsigned long long>(vocab->misses() - misses0));
  // The masking pass alone (a cached mask applied to a row).
  {
    ds::sampling::JsonConstraint c(vocab);
    (void)c.Accept(by_bytes.at("{\""));
    c.Mask(logits);
    auto a = Clock::now();
    for (int i = 0; i < 200; ++i) c.Mask(logits);
    auto b = Clock::now();
    std::printf("masking pass alone (cached, inside a key): %.1f us per row of %zu logits\n",
                Us(a, b) / 200, logits.size());
  }
  return 0;
}
