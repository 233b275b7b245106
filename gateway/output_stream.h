// Turns the scheduler's generated token ids into what the client sees: UTF-8 text deltas from an
// IncrementalDecoder, stop strings cut with a StopMatcher, stop ids (EOS or the request's) kept as
// ids without text. One instance per request; not thread-safe (the request's handler owns it).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/sampling/stop_matcher.h"
#include "common/tokenizer/incremental_decoder.h"
#include "common/tokenizer/tokenizer.h"
#include "gateway/request.h"

namespace ds::gw {

class OutputStream {
 public:
  // `tok` must outlive the stream.
  OutputStream(const Tokenizer* tok, const PreparedRequest& req);

  // One generated token (with its logprob when requested). Returns what to send now (may be
  // empty). After a stop string matched, further tokens are dropped and return empty chunks.
  OutputChunk Push(int32_t token, const TokenLogprob* logprob);
  // Generation ended for another reason: flush held-back text (nothing after a stop match).
  OutputChunk Finish();

  // A stop string matched; the caller tells the scheduler to finish the request.
  bool stopped() const { return stop_index_ >= 0; }
  const std::string& stop_string() const;
  // Tokens accepted (up to and including the one that completed a stop string).
  uint32_t n_tokens() const { return n_tokens_; }

 private:
  const Tokenizer* tok_;
  std::vector<int32_t> stop_ids_;
  std::vector<std::string> stop_strings_;
  IncrementalDecoder decoder_;
  sampling::StopMatcher matcher_;
  int stop_index_ = -1;
  uint32_t n_tokens_ = 0;
};

}  // namespace ds::gw
