#include "common/sampling/json_constraint.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace ds::sampling {

namespace {

// Complete UTF-8 (JsonGrammar's rules) with no '"', '\\' or control byte: what a string takes
// whatever came before it, leaving the string state as it was.
bool StringSafe(std::string_view s) {
  JsonGrammar g;
  if (!g.Feed("{\"")) return false;
  for (char c : s)
    if (c == '"' || c == '\\' || !g.Step(static_cast<uint8_t>(c))) return false;
  return g.in_plain_string();
}

}  // namespace

JsonVocab::JsonVocab(std::span<const std::string> token_bytes, std::span<const int32_t> end_ids)
    : n_vocab_(static_cast<int32_t>(token_bytes.size())),
      bytes_(token_bytes.begin(), token_bytes.end()) {
  for (int32_t id : end_ids)
    if (id >= 0 && id < n_vocab_) end_ids_.push_back(id);
  std::sort(end_ids_.begin(), end_ids_.end());
  end_ids_.erase(std::unique(end_ids_.begin(), end_ids_.end()), end_ids_.end());
  string_safe_.assign((static_cast<size_t>(n_vocab_) + 63) / 64, 0);
  std::vector<int32_t> all, other;
  size_t max_len = 0;
  for (int32_t i = 0; i < n_vocab_; ++i) {
    if (bytes_[i].empty()) continue;
    all.push_back(i);
    max_len = std::max(max_len, bytes_[i].size());
    if (StringSafe(bytes_[i]))
      string_safe_[i >> 6] |= 1ull << (i & 63);
    else
      other.push_back(i);
  }
  all_ = BuildTrie(std::move(all));
  other_ = BuildTrie(std::move(other));
  walk_.resize(max_len + 1);
}

JsonVocab::Trie JsonVocab::BuildTrie(std::vector<int32_t> order) const {
  // Sorted by bytes, a token's prefixes come before it and its extensions after it, so one pass
  // that keeps the current root path builds the preorder trie.
  Trie t;
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return bytes_[a] < bytes_[b]; });
  std::vector<int32_t> path;  // node index per depth - 1 of the current path
  std::string_view prev;
  for (int32_t id : order) {
    const std::string_view s = bytes_[id];
    size_t lcp = 0;
    while (lcp < s.size() && lcp < prev.size() && s[lcp] == prev[lcp]) ++lcp;
    while (path.size() > lcp) {
      t.nodes[path.back()].end = static_cast<int32_t>(t.nodes.size());
      path.pop_back();
    }
    const int32_t here = static_cast<int32_t>(t.ids.size());
    for (size_t d = lcp; d < s.size(); ++d) {
      path.push_back(static_cast<int32_t>(t.nodes.size()));
      t.nodes.push_back(
          Node{static_cast<uint8_t>(s[d]), static_cast<uint16_t>(d + 1), 0, here, here});
    }
    // path.back() is the node of s; equal strings share it and come one after another here.
    t.ids.push_back(id);
    t.nodes[path.back()].tok_end = static_cast<int32_t>(t.ids.size());
    prev = s;
  }
  for (int32_t p : path) t.nodes[p].end = static_cast<int32_t>(t.nodes.size());
  return t;
}

bool JsonVocab::Walk(const Trie& t, const JsonGrammar& g, std::vector<uint64_t>* mask) {
  bool any = false;
  walk_[0] = g;
  const int32_t n = static_cast<int32_t>(t.nodes.size());
  for (int32_t i = 0; i < n;) {
    const Node& node = t.nodes[i];
    JsonGrammar& s = walk_[node.depth];
    s = walk_[node.depth - 1];
    if (!s.Step(node.byte)) {
      i = node.end;  // no token below can be taken
      continue;
    }
    for (int32_t k = node.tok_begin; k < node.tok_end; ++k) {
      const int32_t id = t.ids[k];
      (*mask)[id >> 6] |= 1ull << (id & 63);
      any = true;
    }
    ++i;
  }
  return any;
}

void JsonVocab::Compute(const JsonGrammar& g, std::vector<uint64_t>* mask) {
  mask->assign((static_cast<size_t>(n_vocab_) + 63) / 64, 0);
  bool any = false;
  if (g.in_plain_string()) {
    *mask = string_safe_;
    any = Walk(other_, g, mask) ||
          std::any_of(mask->begin(), mask->end(), [](uint64_t w) { return w != 0; });
  } else if (!g.complete()) {
    any = Walk(all_, g, mask);
  }
  if (!any)
    for (int32_t id : end_ids_) (*mask)[id >> 6] |= 1ull << (id & 63);
}

const std::vector<uint64_t>& JsonVocab::Allowed(const JsonGrammar& g) {
  const JsonGrammar::KeyBytes key = g.Key();
  if (auto it = cache_.find(key); it != cache_.end()) {
    ++hits_;
    return it->second;
  }
  ++misses_;
  if (cache_.size() >= kMaxCached) cache_.clear();
  std::vector<uint64_t>& m = cache_[key];
  Compute(g, &m);
  return m;
}

void JsonConstraint::Mask(std::span<float> logits) {
  const std::vector<uint64_t>& allowed = vocab_->Allowed(g_);
  const size_t n = std::min(logits.size(), static_cast<size_t>(vocab_->n_vocab()));
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  // Per word of 64 tokens, touch whichever side is smaller: the refused ones (inside strings
  // nearly every token is allowed) or, after filling the word, the allowed ones (elsewhere few
  // are).
  const size_t full_words = n / 64;
  for (size_t w = 0; w < full_words; ++w) {
    uint64_t bits = allowed[w];
    if (bits == ~0ull) continue;
    float* p = logits.data() + w * 64;
    if (std::popcount(bits) >= 32) {
      for (uint64_t off = ~bits; off != 0; off &= off - 1) p[std::countr_zero(off)] = kNegInf;
    } else {
      float keep[64];
      for (uint64_t on = bits; on != 0; on &= on - 1)
        keep[std::countr_zero(on)] = p[std::countr_zero(on)];
      std::fill(p, p + 64, kNegInf);
      for (uint64_t on = bits; on != 0; on &= on - 1)
        p[std::countr_zero(on)] = keep[std::countr_zero(on)];
    }
  }
  for (size_t i = full_words * 64; i < n; ++i)
    if (!((allowed[i >> 6] >> (i & 63)) & 1u)) logits[i] = kNegInf;
  for (size_t i = n; i < logits.size(); ++i) logits[i] = kNegInf;  // beyond the vocabulary
}

absl::Status JsonConstraint::Accept(int32_t token) {
  if (token < 0 || token >= vocab_->n_vocab())
    return absl::InvalidArgumentError(absl::StrCat("token ", token, " outside the vocabulary"));
  const std::vector<uint64_t>& allowed = vocab_->Allowed(g_);
  if (!((allowed[token >> 6] >> (token & 63)) & 1u))
    return absl::InvalidArgumentError(
        absl::StrCat("token ", token, " cannot follow the JSON generated so far"));
  JsonGrammar next = g_;
  // An allowed token is either text the grammar takes or an end id (nothing to step).
  if (next.Feed(vocab_->bytes(token))) g_ = next;
  return absl::OkStatus();
}

}  // namespace ds::sampling
