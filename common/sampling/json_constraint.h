// Constrained decoding for `response_format: {"type": "json_object"}`: which tokens of the
// vocabulary may come next so that the generated text stays a prefix of one valid JSON object
// (json_grammar.h), and only end-of-generation tokens once the object is complete.
//
// JsonVocab is built once per model from every token's bytes (Tokenizer::TokenToPiece; control
// and other non-text tokens get an empty string and are never allowed as text) and the ids that
// end generation (EOS). It keeps the tokens in a byte trie, laid out in preorder with each node's
// subtree end, so Allowed() is one pass over the nodes that steps a copy of the grammar state
// per node and skips a whole subtree at the first refused byte: a token is allowed iff every
// byte of it is. The result, a bitmask over the vocabulary, is cached by the grammar state
// (JsonGrammar::Key: lexical state + container stack), which repeats constantly during a
// generation (inside a string, after a value, ...), so most steps cost one lookup plus the
// masking pass over the logits. Figures: docs/perf/cpu.md (json_constraint_bench).
//
// JsonConstraint is one sequence's state: Mask() sets the logits of disallowed tokens to -inf
// before sampling; Accept() advances by the sampled token. A replay (failover) rebuilds it by
// Accept()ing the generated tokens again, so the masks and the tokens come out identical.
// If no token is allowed (a vocabulary without some single-byte token), the end ids are
// allowed so the generation ends rather than sample from nothing.
//
// Thread-safety: JsonVocab's cache is not locked; one thread (the worker's step thread) uses it.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "common/sampling/json_grammar.h"

namespace ds::sampling {

class JsonVocab {
 public:
  // token_bytes: [n_vocab] raw bytes per id ("" = never allowed as text); end_ids: ids allowed
  // only when the object is complete (out-of-range ones are ignored).
  JsonVocab(std::span<const std::string> token_bytes, std::span<const int32_t> end_ids);

  int32_t n_vocab() const { return n_vocab_; }
  size_t n_nodes() const { return all_.nodes.size(); }
  size_t n_other_nodes() const { return other_.nodes.size(); }
  const std::vector<int32_t>& end_ids() const { return end_ids_; }
  const std::string& bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }

  // Bit i of word i / 64 set = token i may come next from grammar state g. The reference lives
  // until the next Allowed() call.
  const std::vector<uint64_t>& Allowed(const JsonGrammar& g);

  // Cache statistics (for the benchmark and tests).
  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }
  void ClearCache() { cache_.clear(); }

 private:
  struct Node {
    uint8_t byte;
    uint16_t depth;     // bytes from the root (1 for the first byte of a token)
    int32_t end;        // index of the first node after this subtree
    int32_t tok_begin;  // ids[tok_begin, tok_end): tokens whose bytes end here
    int32_t tok_end;
  };
  // A byte trie over some of the tokens, in preorder.
  struct Trie {
    std::vector<Node> nodes;
    std::vector<int32_t> ids;  // token ids in trie order
  };
  Trie BuildTrie(std::vector<int32_t> tokens) const;
  // ORs into mask every token of `t` the grammar takes from state g; true if any.
  bool Walk(const Trie& t, const JsonGrammar& g, std::vector<uint64_t>* mask);
  struct KeyHash {
    size_t operator()(const JsonGrammar::KeyBytes& k) const {
      return std::hash<uint64_t>()(k.stack * 0x9e3779b97f4a7c15ULL ^ k.rest);
    }
  };
  void Compute(const JsonGrammar& g, std::vector<uint64_t>* mask);

  int32_t n_vocab_ = 0;
  std::vector<std::string> bytes_;  // [n_vocab]
  Trie all_;                        // every text token
  // Inside a string (no escape or UTF-8 sequence pending) a token of complete UTF-8 without '"',
  // '\\' or control bytes is always taken and changes nothing that matters: string_safe_ has
  // them as a bitmask and other_ is the trie of the rest, so string states (the common and the
  // expensive ones: nearly every token passes there) walk a few percent of the vocabulary.
  std::vector<uint64_t> string_safe_;  // [ceil(n_vocab / 64)]
  Trie other_;
  std::vector<int32_t> end_ids_;
  std::vector<JsonGrammar> walk_;  // [max token length + 1] grammar state per trie depth
  std::unordered_map<JsonGrammar::KeyBytes, std::vector<uint64_t>, KeyHash> cache_;
  uint64_t hits_ = 0, misses_ = 0;
  // Masks are 31 KB at 248k tokens: 512 of them is 16 MB; past that the cache starts over.
  static constexpr size_t kMaxCached = 512;
};

class JsonConstraint {
 public:
  explicit JsonConstraint(std::shared_ptr<JsonVocab> vocab) : vocab_(std::move(vocab)) {}

  // logits: [n_vocab]; disallowed tokens -> -inf.
  void Mask(std::span<float> logits);
  // Advances by `token`; InvalidArgument (state unchanged) when the token was not allowed.
  absl::Status Accept(int32_t token);
  bool complete() const { return g_.complete(); }
  const JsonGrammar& grammar() const { return g_; }

 private:
  std::shared_ptr<JsonVocab> vocab_;
  JsonGrammar g_;
};

}  // namespace ds::sampling
