#include "common/tokenizer/prompt_encoder.h"

#include <algorithm>

namespace ds {

PromptEncoder::PromptEncoder(const Tokenizer* tok) : tok_(tok) {
  for (int32_t id = 0; id < tok->n_vocab(); ++id) {
    const TokenType t = tok->token_type(id);
    if (t != TokenType::kControl && t != TokenType::kUserDefined) continue;
    auto piece = tok->TokenToPiece(id, /*render_special=*/true);
    if (!piece.ok() || piece->empty()) continue;
    // FindToken: the lowest id of a text, as Encode's own special split picks.
    std::optional<int32_t> canonical = tok->FindToken(*piece);
    if (canonical && *canonical != id) continue;
    specials_.emplace_back(std::string(*piece), id);
  }
  std::stable_sort(specials_.begin(), specials_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
}

absl::StatusOr<std::vector<int32_t>> PromptEncoder::Encode(const RenderedPrompt& p) const {
  std::vector<int32_t> ids;
  size_t plain_from = 0;  // start of the plain text not yet encoded
  auto flush_plain = [&](size_t end) -> absl::Status {
    if (end <= plain_from) return absl::OkStatus();
    auto part = tok_->Encode(std::string_view(p.text).substr(plain_from, end - plain_from),
                             /*parse_special=*/false);
    if (!part.ok()) return part.status();
    ids.insert(ids.end(), part->begin(), part->end());
    return absl::OkStatus();
  };
  for (const auto& [begin, end] : p.trusted) {
    size_t i = begin;
    while (i < end) {
      const std::pair<std::string, int32_t>* hit = nullptr;
      for (const auto& s : specials_) {
        if (i + s.first.size() <= end && p.text.compare(i, s.first.size(), s.first) == 0) {
          hit = &s;
          break;
        }
      }
      if (!hit) {
        ++i;
        continue;
      }
      if (absl::Status st = flush_plain(i); !st.ok()) return st;
      ids.push_back(hit->second);
      i += hit->first.size();
      plain_from = i;
    }
  }
  if (absl::Status st = flush_plain(p.text.size()); !st.ok()) return st;
  return ids;
}

}  // namespace ds
