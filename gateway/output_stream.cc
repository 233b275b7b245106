#include "gateway/output_stream.h"

#include <algorithm>

namespace ds::gw {

OutputStream::OutputStream(const Tokenizer* tok, const PreparedRequest& req)
    : tok_(tok),
      stop_ids_(req.stop_ids),
      stop_strings_(req.stop_strings),
      decoder_(tok),
      matcher_(req.stop_strings) {}

const std::string& OutputStream::stop_string() const {
  static const std::string kNone;
  return stop_index_ >= 0 ? stop_strings_[static_cast<size_t>(stop_index_)] : kNone;
}

OutputChunk OutputStream::Push(int32_t token, const TokenLogprob* logprob) {
  OutputChunk c;
  if (stopped()) return c;
  ++n_tokens_;
  c.token_ids.push_back(token);
  if (logprob) c.logprobs.push_back(*logprob);
  // A stop id ends generation; like `deltaserve generate`, its text is not part of the output.
  if (std::find(stop_ids_.begin(), stop_ids_.end(), token) != stop_ids_.end()) return c;
  if (!tok_->has_vocab()) return c;
  absl::StatusOr<std::string> delta = decoder_.Feed(token);
  if (!delta.ok()) return c;  // an id the tokenizer does not know renders as nothing
  sampling::StopMatch m = matcher_.Push(*delta);
  c.text = std::move(m.text);
  if (m.stopped) stop_index_ = m.stop_index;
  return c;
}

OutputChunk OutputStream::Finish() {
  OutputChunk c;
  if (stopped() || !tok_->has_vocab()) return c;
  sampling::StopMatch m = matcher_.Push(decoder_.Flush());
  c.text = std::move(m.text);
  if (m.stopped) {
    stop_index_ = m.stop_index;
    return c;
  }
  c.text += matcher_.Finish().text;
  return c;
}

}  // namespace ds::gw
