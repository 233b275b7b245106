#include "common/tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <mutex>
#include <queue>
#include <unordered_map>

#include "absl/strings/str_format.h"
#include "common/gguf/gguf.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/pretokenizer.h"

namespace ds {
namespace {

constexpr size_t kMaxCachedWordBytes = 256;
constexpr size_t kMaxCacheEntries = 1 << 16;

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

bool IsBpeType(int32_t t) {
  // Tokens reachable by byte-level BPE. kUndefined appears in files written without types.
  return t == static_cast<int32_t>(TokenType::kNormal) || t == static_cast<int32_t>(TokenType::kByte) ||
         t == static_cast<int32_t>(TokenType::kUndefined);
}

}  // namespace

struct Tokenizer::Impl {
  std::string model;
  std::string pre;
  bool has_vocab = false;
  std::vector<std::string> pieces;  // raw bytes by id
  std::vector<int32_t> types;
  std::unordered_map<std::string, int32_t> bpe_piece_to_id;  // normal/byte tokens
  std::unordered_map<std::string, int32_t> any_piece_to_id;  // every token, lowest id
  std::array<int32_t, 256> byte_token{};
  struct Merge {
    int32_t rank;
    int32_t merged;
  };
  std::unordered_map<uint64_t, Merge> merges;
  int64_t skipped_merges = 0;
  // Control/user-defined texts, longest first, with a first-byte filter.
  std::vector<std::pair<std::string, int32_t>> specials;
  std::array<bool, 256> special_first{};
  std::optional<tok::PreTokenizer> pretok;
  int32_t eos = -1, bos = -1, pad = -1;
  bool add_bos = false;
  std::vector<int32_t> eos_ids;

  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  absl::Status BpeWord(std::string_view word, std::vector<int32_t>* out) const;
  absl::Status EncodeText(std::string_view text, std::vector<int32_t>* out) const;
};

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

absl::StatusOr<Tokenizer> Tokenizer::FromData(const TokenizerData& d) {
  Tokenizer t;
  Impl& m = *t.impl_;
  m.model = d.model;
  m.eos = d.eos_id;
  m.bos = d.bos_id;
  m.pad = d.pad_id;
  m.add_bos = d.add_bos;
  if (d.model == "none") {
    m.has_vocab = false;
    if (d.eos_id >= 0) m.eos_ids.push_back(d.eos_id);
    return t;
  }
  if (d.model != "gpt2") {
    return absl::UnimplementedError(absl::StrCat("tokenizer.ggml.model: unsupported model '",
                                                 d.model, "' (supported: gpt2, none)"));
  }
  m.has_vocab = true;
  m.pre = d.pre;
  DS_ASSIGN_OR_RETURN(auto pretok, tok::PreTokenizer::Create(d.pre));
  m.pretok.emplace(std::move(pretok));

  const size_t n = d.tokens.size();
  if (n == 0) return absl::InvalidArgumentError("tokenizer.ggml.tokens: empty vocabulary");
  if (n > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError("tokenizer.ggml.tokens: too many tokens");
  }
  if (!d.token_types.empty() && d.token_types.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.ggml.token_type: length ", d.token_types.size(),
                     " != tokenizer.ggml.tokens length ", n));
  }
  for (auto [key, id] : {std::pair{"tokenizer.ggml.eos_token_id", d.eos_id},
                         std::pair{"tokenizer.ggml.bos_token_id", d.bos_id},
                         std::pair{"tokenizer.ggml.padding_token_id", d.pad_id}}) {
    if (id >= static_cast<int64_t>(n)) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, ": id ", id, " out of range [0, ", n, ")"));
    }
  }
  m.pieces.resize(n);
  m.types.resize(n, static_cast<int32_t>(TokenType::kNormal));
  m.bpe_piece_to_id.reserve(n);
  m.any_piece_to_id.reserve(n);
  m.byte_token.fill(-1);
  m.special_first.fill(false);
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = static_cast<int32_t>(i);
    if (!d.token_types.empty()) {
      const int32_t ty = d.token_types[i];
      if (ty < 0 || ty > 6) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer.ggml.token_type[", i, "]: invalid type ", ty));
      }
      m.types[i] = ty;
    }
    const int32_t ty = m.types[i];
    if (IsBpeType(ty)) {
      // Normal tokens are spelled with the GPT-2 byte mapping. A string outside the mapping's
      // image cannot come from byte-level BPE; keep its UTF-8 as the piece so Decode still works.
      auto raw = tok::Gpt2ToBytes(d.tokens[i]);
      m.pieces[i] = raw ? std::move(*raw) : d.tokens[i];
      if (raw) {
        m.bpe_piece_to_id.emplace(m.pieces[i], id);
        if (m.pieces[i].size() == 1) {
          auto b = static_cast<uint8_t>(m.pieces[i][0]);
          if (m.byte_token[b] < 0) m.byte_token[b] = id;
        }
      }
    } else {
      m.pieces[i] = d.tokens[i];
      if ((ty == static_cast<int32_t>(TokenType::kControl) ||
           ty == static_cast<int32_t>(TokenType::kUserDefined)) &&
          !d.tokens[i].empty()) {
        m.specials.emplace_back(d.tokens[i], id);
        m.special_first[static_cast<uint8_t>(d.tokens[i][0])] = true;
      }
    }
    m.any_piece_to_id.emplace(m.pieces[i], id);
  }
  // Longest first so that the first hit at a position is the longest match; ties by id.
  std::stable_sort(m.specials.begin(), m.specials.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });

  m.merges.reserve(d.merges.size());
  for (size_t r = 0; r < d.merges.size(); ++r) {
    const std::string& s = d.merges[r];
    const size_t sp = s.find(' ', 1);
    if (sp == std::string::npos || sp + 1 >= s.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.ggml.merges[", r, "]: expected \"left right\", got \"", s, "\""));
    }
    auto left = tok::Gpt2ToBytes(std::string_view(s).substr(0, sp));
    auto right = tok::Gpt2ToBytes(std::string_view(s).substr(sp + 1));
    if (!left || !right) {
      ++m.skipped_merges;
      continue;
    }
    auto li = m.bpe_piece_to_id.find(*left);
    auto ri = m.bpe_piece_to_id.find(*right);
    auto mi = m.bpe_piece_to_id.find(*left + *right);
    if (li == m.bpe_piece_to_id.end() || ri == m.bpe_piece_to_id.end() ||
        mi == m.bpe_piece_to_id.end()) {
      ++m.skipped_merges;
      continue;
    }
    // The first (lowest-rank) occurrence of a pair wins, as in HF and llama.cpp.
    m.merges.emplace(PairKey(li->second, ri->second),
                     Impl::Merge{static_cast<int32_t>(r), mi->second});
  }

  if (m.eos >= 0) m.eos_ids.push_back(m.eos);
  for (const char* name : {"<|im_end|>", "<|endoftext|>"}) {
    auto it = m.any_piece_to_id.find(name);
    if (it != m.any_piece_to_id.end()) m.eos_ids.push_back(it->second);
  }
  std::sort(m.eos_ids.begin(), m.eos_ids.end());
  m.eos_ids.erase(std::unique(m.eos_ids.begin(), m.eos_ids.end()), m.eos_ids.end());
  return t;
}

absl::StatusOr<Tokenizer> Tokenizer::FromGguf(const gguf::File& file) {
  DS_ASSIGN_OR_RETURN(TokenizerData data, ReadTokenizerData(file));
  return FromData(data);
}

absl::Status Tokenizer::Impl::BpeWord(std::string_view word, std::vector<int32_t>* out) const {
  const size_t n = word.size();
  // Symbols start as single bytes; merged symbols keep the left slot, the right slot dies.
  std::vector<int32_t> ids(n);  // [n] current token id per live slot
  std::vector<int32_t> prev(n), next(n);
  for (size_t i = 0; i < n; ++i) {
    const int32_t b = byte_token[static_cast<uint8_t>(word[i])];
    if (b < 0) {
      return absl::FailedPreconditionError(
          absl::StrFormat("vocabulary has no token for byte 0x%02X", static_cast<uint8_t>(word[i])));
    }
    ids[i] = b;
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = (i + 1 < n) ? static_cast<int32_t>(i + 1) : -1;
  }
  struct Cand {
    int32_t rank, left, right, lid, rid;
    bool operator>(const Cand& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;  // lowest rank, then leftmost
    }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> pq;
  auto push = [&](int32_t l) {
    if (l < 0) return;
    const int32_t r = next[l];
    if (r < 0) return;
    auto it = merges.find(PairKey(ids[l], ids[r]));
    if (it != merges.end()) pq.push(Cand{it->second.rank, l, r, ids[l], ids[r]});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  std::vector<bool> dead(n, false);
  while (!pq.empty()) {
    const Cand c = pq.top();
    pq.pop();
    // Stale if either side was merged away or changed since the candidate was queued.
    if (dead[c.left] || dead[c.right] || next[c.left] != c.right || ids[c.left] != c.lid ||
        ids[c.right] != c.rid) {
      continue;
    }
    ids[c.left] = merges.find(PairKey(c.lid, c.rid))->second.merged;
    dead[c.right] = true;
    next[c.left] = next[c.right];
    if (next[c.right] >= 0) prev[next[c.right]] = c.left;
    push(prev[c.left]);
    push(c.left);
  }
  for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = next[i]) out->push_back(ids[i]);
  return absl::OkStatus();
}

absl::Status Tokenizer::Impl::EncodeText(std::string_view text, std::vector<int32_t>* out) const {
  std::vector<std::string_view> words;
  DS_RETURN_IF_ERROR(pretok->Split(text, &words));
  for (std::string_view w : words) {
    if (w.size() <= kMaxCachedWordBytes) {
      std::lock_guard<std::mutex> lock(cache_mu);
      auto it = cache.find(std::string(w));
      if (it != cache.end()) {
        out->insert(out->end(), it->second.begin(), it->second.end());
        continue;
      }
    }
    const size_t start = out->size();
    DS_RETURN_IF_ERROR(BpeWord(w, out));
    if (w.size() <= kMaxCachedWordBytes) {
      std::lock_guard<std::mutex> lock(cache_mu);
      if (cache.size() >= kMaxCacheEntries) cache.clear();
      cache.emplace(std::string(w), std::vector<int32_t>(out->begin() + start, out->end()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text,
                                                       bool parse_special) const {
  const Impl& m = *impl_;
  if (!m.has_vocab) {
    return absl::FailedPreconditionError("model has no vocabulary; use --prompt-ids");
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (!parse_special || m.specials.empty()) {
    DS_RETURN_IF_ERROR(m.EncodeText(text, &out));
    return out;
  }
  size_t seg = 0;  // start of the pending plain-text segment
  size_t i = 0;
  while (i < text.size()) {
    const std::pair<std::string, int32_t>* hit = nullptr;
    if (m.special_first[static_cast<uint8_t>(text[i])]) {
      for (const auto& sp : m.specials) {
        if (text.compare(i, sp.first.size(), sp.first) == 0) {
          hit = &sp;
          break;
        }
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    if (i > seg) DS_RETURN_IF_ERROR(m.EncodeText(text.substr(seg, i - seg), &out));
    out.push_back(hit->second);
    i += hit->first.size();
    seg = i;
  }
  if (seg < text.size()) DS_RETURN_IF_ERROR(m.EncodeText(text.substr(seg), &out));
  return out;
}

absl::StatusOr<std::string_view> Tokenizer::TokenToPiece(int32_t id, bool render_special) const {
  const Impl& m = *impl_;
  if (!m.has_vocab) {
    return absl::FailedPreconditionError("model has no vocabulary; use --prompt-ids");
  }
  if (id < 0 || static_cast<size_t>(id) >= m.pieces.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token id ", id, " out of range [0, ", m.pieces.size(), ")"));
  }
  const int32_t ty = m.types[static_cast<size_t>(id)];
  if (ty == static_cast<int32_t>(TokenType::kUnused)) return std::string_view();
  if (ty == static_cast<int32_t>(TokenType::kControl) && !render_special) {
    return std::string_view();
  }
  return std::string_view(m.pieces[static_cast<size_t>(id)]);
}

absl::StatusOr<std::string> Tokenizer::Decode(std::span<const int32_t> ids,
                                              bool render_special) const {
  std::string out;
  for (int32_t id : ids) {
    DS_ASSIGN_OR_RETURN(std::string_view piece, TokenToPiece(id, render_special));
    out.append(piece);
  }
  return out;
}

bool Tokenizer::has_vocab() const { return impl_->has_vocab; }
const std::string& Tokenizer::model_name() const { return impl_->model; }
const std::string& Tokenizer::pre_name() const { return impl_->pre; }
int32_t Tokenizer::n_vocab() const { return static_cast<int32_t>(impl_->pieces.size()); }
int32_t Tokenizer::eos_id() const { return impl_->eos; }
int32_t Tokenizer::bos_id() const { return impl_->bos; }
int32_t Tokenizer::pad_id() const { return impl_->pad; }
bool Tokenizer::add_bos() const { return impl_->add_bos; }
const std::vector<int32_t>& Tokenizer::eos_ids() const { return impl_->eos_ids; }
int64_t Tokenizer::n_skipped_merges() const { return impl_->skipped_merges; }

bool Tokenizer::IsEos(int32_t id) const {
  return std::binary_search(impl_->eos_ids.begin(), impl_->eos_ids.end(), id);
}

TokenType Tokenizer::token_type(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->types.size()) return TokenType::kUndefined;
  return static_cast<TokenType>(impl_->types[static_cast<size_t>(id)]);
}

std::optional<int32_t> Tokenizer::FindToken(std::string_view text) const {
  auto it = impl_->any_piece_to_id.find(std::string(text));
  if (it == impl_->any_piece_to_id.end()) return std::nullopt;
  return it->second;
}

}  // namespace ds
