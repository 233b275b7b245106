// PrefixTree: the scheduler's half of the prefix cache (issue #17), one per replica core.
//
// A radix tree of token ids (edges hold runs of tokens, so a 16k-token chat is a handful of
// nodes). It records two things:
//   - every prompt the replica has seen (paths), so a new request learns the longest prefix it
//     shares with any earlier or queued request: the place where a checkpoint is worth taking;
//   - checkpoints on the worker (worker/runner/checkpoint_store.h) at exact positions: a node
//     that ends at position p may carry one, the worker's saved state after the first p tokens.
// A checkpoint is kPlanned (a running request will save it when its prefill reaches p), then
// kSaving (the step that saves it is in flight), then kReady (the worker reported it saved);
// the worker's evictions and failures remove it. Only kReady checkpoints are resumed from, so
// the tree never names state the worker does not hold. Ids are unique per tree (replica).
//
// Seen paths are bounded (max_tokens): least recently seen leaves without a checkpoint go
// first. Pure data structure: no clock, no I/O; the core calls it from its one thread.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "scheduler/core/types.h"

namespace ds::sched {

struct PrefixCheckpoint {
  enum class State : uint8_t { kPlanned, kSaving, kReady };
  uint64_t id = 0;
  int32_t length = 0;       // positions it holds (the first `length` tokens of its path)
  State state = State::kPlanned;
  uint64_t bytes = 0;       // kReady: as the worker reported
  uint64_t producer = 0;    // kPlanned / kSaving: the request that saves it
};

class PrefixTree {
 public:
  explicit PrefixTree(int64_t max_tokens = int64_t{1} << 22);
  ~PrefixTree();
  PrefixTree(const PrefixTree&) = delete;
  PrefixTree& operator=(const PrefixTree&) = delete;

  // Records `tokens` as a seen path (tick = the caller's logical time, for pruning).
  void Insert(std::span<const int32_t> tokens, uint64_t tick);
  // Length of the longest prefix of `tokens` that some seen path shares.
  int32_t LongestSeen(std::span<const int32_t> tokens) const;
  // The checkpoint of the longest prefix of tokens[0, limit) whose checkpoint is in `state`
  // (kReady: what a request may resume from); null when none.
  const PrefixCheckpoint* Longest(std::span<const int32_t> tokens, int32_t limit,
                                  PrefixCheckpoint::State state) const;
  // Every checkpoint on the path of tokens[0, limit), shortest first.
  std::vector<const PrefixCheckpoint*> OnPath(std::span<const int32_t> tokens, int32_t limit) const;

  // A new kPlanned checkpoint after tokens[0, length) (the path is inserted); 0 when that position
  // already has a checkpoint (in any state) or length < 1.
  uint64_t Plan(std::span<const int32_t> tokens, int32_t length, uint64_t producer, uint64_t tick);
  const PrefixCheckpoint* Find(uint64_t id) const;
  void MarkSaving(uint64_t id);
  // The worker saved it: kReady with its bytes. Unknown ids are ignored (dropped meanwhile).
  void Confirm(uint64_t id, uint64_t bytes);
  // Gone from the worker (evicted) or never saved (failed / cancelled): forgotten.
  void Remove(uint64_t id);
  // Forget every checkpoint (the worker's store is gone) and every seen path.
  void Clear();

  int64_t tokens() const { return n_tokens_; }
  int64_t ready_checkpoints() const { return n_ready_; }
  uint64_t ready_bytes() const { return ready_bytes_; }

 private:
  struct Node {
    std::vector<int32_t> edge;  // tokens from the parent to this node
    int32_t depth = 0;          // tokens from the root to the end of this node
    Node* parent = nullptr;
    std::map<int32_t, std::unique_ptr<Node>> children;  // by first edge token
    PrefixCheckpoint* checkpoint = nullptr;             // owned by checkpoints_
    uint64_t tick = 0;                                  // last time a path through it was inserted
  };
  // Walks tokens[0, limit) as far as the tree matches: the deepest node fully matched and the
  // matched length (which may end inside a child's edge).
  struct Walk {
    Node* node;
    int32_t matched;
  };
  Walk Descend(std::span<const int32_t> tokens, int32_t limit) const;
  // The node ending exactly at tokens[0, length), creating / splitting nodes as needed.
  Node* NodeAt(std::span<const int32_t> tokens, int32_t length, uint64_t tick);
  void Prune();
  void Erase(Node* n);    // removes a leaf without checkpoint
  void Compact(Node* n);  // merges bare single-child nodes below n with their child

  std::unique_ptr<Node> root_;
  int64_t max_tokens_;
  int64_t n_tokens_ = 0;  // sum of edge lengths
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<PrefixCheckpoint>> checkpoints_;
  std::unordered_map<uint64_t, Node*> node_of_;  // checkpoint id -> its node
  int64_t n_ready_ = 0;
  uint64_t ready_bytes_ = 0;
};

}  // namespace ds::sched
