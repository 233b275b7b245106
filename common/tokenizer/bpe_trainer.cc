// TrainBpe: incremental byte-level BPE training (see bpe_trainer.h).
#include "common/tokenizer/bpe_trainer.h"

#include <algorithm>
#include <map>
#include <queue>
#include <tuple>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/pretokenizer.h"

namespace ds {
namespace {

constexpr const char* kControl[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};

uint64_t Key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

struct Word {
  std::vector<int32_t> syms;
  int64_t count = 0;
  int32_t stamp = -1;  // last merge round that visited this word (dedupes the index lists)
};

}  // namespace

absl::StatusOr<TokenizerData> TrainBpe(std::string_view text, const BpeTrainOptions& opts) {
  const int n_control = 3;
  if (opts.vocab_size < 256 + n_control)
    return absl::InvalidArgumentError(
        absl::StrCat("bpe: vocab_size ", opts.vocab_size, " is below 256 bytes + 3 control tokens"));
  DS_ASSIGN_OR_RETURN(auto pretok, tok::PreTokenizer::Create(opts.pre));

  // Word frequencies over the text with the control-token texts cut out.
  std::map<std::string, int64_t> freq;  // ordered: deterministic word ids
  {
    std::vector<std::string_view> pieces;
    size_t pos = 0;
    while (pos < text.size()) {
      size_t next = std::string_view::npos, len = 0;
      for (const char* c : kControl) {
        const size_t f = text.find(c, pos);
        if (f < next) next = f, len = std::string_view(c).size();
      }
      const std::string_view seg = text.substr(pos, next == std::string_view::npos ? text.size() - pos : next - pos);
      pieces.clear();
      DS_RETURN_IF_ERROR(pretok.Split(seg, &pieces));
      for (std::string_view w : pieces) ++freq[std::string(w)];
      if (next == std::string_view::npos) break;
      pos = next + len;
    }
  }

  std::vector<std::string> pieces;  // raw bytes by id
  std::unordered_map<std::string, int32_t> piece_id;
  for (uint8_t b : tok::BytesInCanonicalOrder()) {
    piece_id.emplace(std::string(1, static_cast<char>(b)), static_cast<int32_t>(pieces.size()));
    pieces.emplace_back(1, static_cast<char>(b));
  }
  std::vector<Word> words;
  words.reserve(freq.size());
  for (const auto& [w, c] : freq) {
    Word word;
    word.count = c;
    for (char ch : w) word.syms.push_back(piece_id.at(std::string(1, ch)));
    words.push_back(std::move(word));
  }

  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::vector<int32_t>> pair_words;
  for (int32_t wi = 0; wi < static_cast<int32_t>(words.size()); ++wi) {
    const Word& w = words[wi];
    for (size_t i = 0; i + 1 < w.syms.size(); ++i) {
      const uint64_t k = Key(w.syms[i], w.syms[i + 1]);
      pair_count[k] += w.count;
      auto& lst = pair_words[k];
      if (lst.empty() || lst.back() != wi) lst.push_back(wi);
    }
  }
  // Max-heap on (count, then lowest pair); entries go stale when a count changes and are skipped.
  using Entry = std::tuple<int64_t, uint64_t>;
  auto cmp = [](const Entry& x, const Entry& y) {
    if (std::get<0>(x) != std::get<0>(y)) return std::get<0>(x) < std::get<0>(y);
    return std::get<1>(x) > std::get<1>(y);
  };
  std::priority_queue<Entry, std::vector<Entry>, decltype(cmp)> heap(cmp);
  for (const auto& [k, c] : pair_count) heap.emplace(c, k);

  TokenizerData d;
  d.model = "gpt2";
  d.pre = opts.pre;
  const int target_pieces = opts.vocab_size - n_control;
  std::vector<uint64_t> touched;
  int32_t round = 0;
  while (static_cast<int>(pieces.size()) < target_pieces && !heap.empty()) {
    const auto [c, k] = heap.top();
    heap.pop();
    auto it = pair_count.find(k);
    if (it == pair_count.end() || it->second != c) continue;  // stale
    if (c < opts.min_pair_count) break;
    const int32_t a = static_cast<int32_t>(k >> 32), b = static_cast<int32_t>(k & 0xffffffffu);
    const std::string merged = pieces[a] + pieces[b];
    int32_t id;
    if (auto f = piece_id.find(merged); f != piece_id.end()) {
      id = f->second;
    } else {
      id = static_cast<int32_t>(pieces.size());
      piece_id.emplace(merged, id);
      pieces.push_back(merged);
    }
    d.merges.push_back(tok::BytesToGpt2(pieces[a]) + " " + tok::BytesToGpt2(pieces[b]));
    touched.clear();
    std::vector<int32_t> wlist = std::move(pair_words[k]);
    pair_words.erase(k);
    for (int32_t wi : wlist) {
      Word& w = words[wi];
      if (w.stamp == round) continue;
      w.stamp = round;
      bool has = false;
      for (size_t i = 0; i + 1 < w.syms.size(); ++i)
        if (w.syms[i] == a && w.syms[i + 1] == b) has = true;
      if (!has) continue;
      for (size_t i = 0; i + 1 < w.syms.size(); ++i) {
        const uint64_t pk = Key(w.syms[i], w.syms[i + 1]);
        pair_count[pk] -= w.count;
        touched.push_back(pk);
      }
      std::vector<int32_t> out;
      out.reserve(w.syms.size());
      for (size_t i = 0; i < w.syms.size(); ++i) {
        if (i + 1 < w.syms.size() && w.syms[i] == a && w.syms[i + 1] == b) {
          out.push_back(id);
          ++i;
        } else {
          out.push_back(w.syms[i]);
        }
      }
      w.syms = std::move(out);
      for (size_t i = 0; i + 1 < w.syms.size(); ++i) {
        const uint64_t pk = Key(w.syms[i], w.syms[i + 1]);
        pair_count[pk] += w.count;
        touched.push_back(pk);
        if (pk != k) {
          auto& lst = pair_words[pk];
          if (lst.empty() || lst.back() != wi) lst.push_back(wi);
        }
      }
    }
    pair_count.erase(k);
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (uint64_t pk : touched) {
      auto pc = pair_count.find(pk);
      if (pc == pair_count.end()) continue;
      if (pc->second <= 0) {
        pair_count.erase(pc);
        pair_words.erase(pk);
      } else {
        heap.emplace(pc->second, pk);
      }
    }
    ++round;
  }

  for (const std::string& p : pieces) {
    d.tokens.push_back(tok::BytesToGpt2(p));
    d.token_types.push_back(static_cast<int32_t>(TokenType::kNormal));
  }
  for (int id = static_cast<int>(pieces.size()); id < target_pieces; ++id) {
    d.tokens.push_back(absl::StrCat("[PAD", id, "]"));
    d.token_types.push_back(static_cast<int32_t>(TokenType::kUnused));
  }
  for (const char* special : kControl) {
    d.tokens.emplace_back(special);
    d.token_types.push_back(static_cast<int32_t>(TokenType::kControl));
  }
  const auto n = static_cast<int32_t>(d.tokens.size());
  d.pad_id = n - 3;  // <|endoftext|>
  d.eos_id = n - 1;  // <|im_end|>
  d.bos_id = -1;
  d.add_bos = false;
  return d;
}

}  // namespace ds
