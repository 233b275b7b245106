// The vocabulary table of response_format json_object (common/sampling/json_constraint.h) for
// the model a worker serves: every token's bytes from the GGUF's tokenizer, built once, the first
// time a request asks for it (a 248k vocabulary takes a fraction of a second; docs/perf/cpu.md).
#pragma once
#include <memory>

#include "absl/status/statusor.h"
#include "common/gguf/gguf.h"
#include "common/sampling/json_constraint.h"
#include "common/tokenizer/tokenizer.h"

namespace ds::worker {

// Text tokens (normal and byte tokens) keep their bytes; control, user-defined (<think>,
// <tool_call>: the chat parser would read them as tags) and unused tokens are never allowed as
// text; the tokenizer's EOS ids end the object. FailedPrecondition without a vocabulary.
absl::StatusOr<std::shared_ptr<sampling::JsonVocab>> JsonVocabFromTokenizer(const Tokenizer& tok);
absl::StatusOr<std::shared_ptr<sampling::JsonVocab>> JsonVocabFromGguf(const gguf::File& file);

}  // namespace ds::worker
