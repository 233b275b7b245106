#include "scheduler/core/prefix_tree.h"

#include <algorithm>
#include <functional>

namespace ds::sched {

PrefixTree::PrefixTree(int64_t max_tokens)
    : root_(std::make_unique<Node>()), max_tokens_(max_tokens) {}

PrefixTree::~PrefixTree() = default;

PrefixTree::Walk PrefixTree::Descend(std::span<const int32_t> tokens, int32_t limit) const {
  Node* node = root_.get();
  int32_t pos = 0;
  limit = std::min<int32_t>(limit, static_cast<int32_t>(tokens.size()));
  while (pos < limit) {
    auto it = node->children.find(tokens[pos]);
    if (it == node->children.end()) break;
    Node* child = it->second.get();
    const int32_t n = std::min<int32_t>(static_cast<int32_t>(child->edge.size()), limit - pos);
    int32_t k = 0;
    while (k < n && child->edge[k] == tokens[pos + k]) ++k;
    if (k < static_cast<int32_t>(child->edge.size())) return {node, pos + k};
    node = child;
    pos += k;
  }
  return {node, pos};
}

int32_t PrefixTree::LongestSeen(std::span<const int32_t> tokens) const {
  return Descend(tokens, static_cast<int32_t>(tokens.size())).matched;
}

std::vector<const PrefixCheckpoint*> PrefixTree::OnPath(std::span<const int32_t> tokens,
                                                        int32_t limit) const {
  std::vector<const PrefixCheckpoint*> out;
  const Walk w = Descend(tokens, limit);
  // The fully matched nodes are w.node and its ancestors.
  for (const Node* n = w.node; n != nullptr; n = n->parent)
    if (n->checkpoint) out.push_back(n->checkpoint);
  std::reverse(out.begin(), out.end());
  return out;
}

const PrefixCheckpoint* PrefixTree::Longest(std::span<const int32_t> tokens, int32_t limit,
                                            PrefixCheckpoint::State state) const {
  const Walk w = Descend(tokens, limit);
  for (const Node* n = w.node; n != nullptr; n = n->parent)
    if (n->checkpoint && n->checkpoint->state == state) return n->checkpoint;
  return nullptr;
}

PrefixTree::Node* PrefixTree::NodeAt(std::span<const int32_t> tokens, int32_t length,
                                     uint64_t tick) {
  Node* node = root_.get();
  node->tick = tick;
  int32_t pos = 0;
  while (pos < length) {
    auto it = node->children.find(tokens[pos]);
    if (it == node->children.end()) {
      auto leaf = std::make_unique<Node>();
      leaf->edge.assign(tokens.begin() + pos, tokens.begin() + length);
      leaf->depth = length;
      leaf->parent = node;
      leaf->tick = tick;
      n_tokens_ += length - pos;
      Node* raw = leaf.get();
      node->children.emplace(tokens[pos], std::move(leaf));
      return raw;
    }
    Node* child = it->second.get();
    const int32_t n = std::min<int32_t>(static_cast<int32_t>(child->edge.size()), length - pos);
    int32_t k = 0;
    while (k < n && child->edge[k] == tokens[pos + k]) ++k;
    if (k < static_cast<int32_t>(child->edge.size())) {
      // Split the child's edge at k: a new node ends there, the child hangs below it.
      auto mid = std::make_unique<Node>();
      mid->edge.assign(child->edge.begin(), child->edge.begin() + k);
      mid->depth = pos + k;
      mid->parent = node;
      mid->tick = std::max(child->tick, tick);
      std::unique_ptr<Node> owned = std::move(it->second);
      owned->edge.erase(owned->edge.begin(), owned->edge.begin() + k);
      owned->parent = mid.get();
      const int32_t first = owned->edge.front();
      mid->children.emplace(first, std::move(owned));
      Node* raw = mid.get();
      it->second = std::move(mid);
      node = raw;
      pos += k;
      continue;  // the next iteration adds the rest below `mid` (or stops at length)
    }
    child->tick = tick;
    node = child;
    pos += k;
  }
  return node;
}

void PrefixTree::Insert(std::span<const int32_t> tokens, uint64_t tick) {
  if (tokens.empty()) return;
  NodeAt(tokens, static_cast<int32_t>(tokens.size()), tick);
  if (n_tokens_ > max_tokens_) Prune();
}

uint64_t PrefixTree::Plan(std::span<const int32_t> tokens, int32_t length, uint64_t producer,
                          uint64_t tick) {
  if (length < 1 || length > static_cast<int32_t>(tokens.size())) return 0;
  Node* n = NodeAt(tokens, length, tick);
  if (n->checkpoint) return 0;
  auto c = std::make_unique<PrefixCheckpoint>();
  c->id = next_id_++;
  c->length = length;
  c->producer = producer;
  n->checkpoint = c.get();
  node_of_[c->id] = n;
  const uint64_t id = c->id;
  checkpoints_.emplace(id, std::move(c));
  if (n_tokens_ > max_tokens_) Prune();
  return id;
}

const PrefixCheckpoint* PrefixTree::Find(uint64_t id) const {
  auto it = checkpoints_.find(id);
  return it == checkpoints_.end() ? nullptr : it->second.get();
}

void PrefixTree::MarkSaving(uint64_t id) {
  auto it = checkpoints_.find(id);
  if (it != checkpoints_.end() && it->second->state == PrefixCheckpoint::State::kPlanned)
    it->second->state = PrefixCheckpoint::State::kSaving;
}

void PrefixTree::Confirm(uint64_t id, uint64_t bytes) {
  auto it = checkpoints_.find(id);
  if (it == checkpoints_.end() || it->second->state == PrefixCheckpoint::State::kReady) return;
  it->second->state = PrefixCheckpoint::State::kReady;
  it->second->bytes = bytes;
  it->second->producer = 0;
  ++n_ready_;
  ready_bytes_ += bytes;
}

void PrefixTree::Remove(uint64_t id) {
  auto it = checkpoints_.find(id);
  if (it == checkpoints_.end()) return;
  if (it->second->state == PrefixCheckpoint::State::kReady) {
    --n_ready_;
    ready_bytes_ -= it->second->bytes;
  }
  node_of_.at(id)->checkpoint = nullptr;
  node_of_.erase(id);
  checkpoints_.erase(it);
}

void PrefixTree::Clear() {
  root_ = std::make_unique<Node>();
  checkpoints_.clear();
  node_of_.clear();
  n_tokens_ = 0;
  n_ready_ = 0;
  ready_bytes_ = 0;
}

void PrefixTree::Erase(Node* n) {
  n_tokens_ -= static_cast<int64_t>(n->edge.size());
  n->parent->children.erase(n->edge.front());  // destroys n
}

void PrefixTree::Compact(Node* n) {
  for (auto& [t, c] : n->children) Compact(c.get());
  // A node with one child and nothing of its own is merged with that child (radix form).
  while (n != root_.get() && n->checkpoint == nullptr && n->children.size() == 1) {
    std::unique_ptr<Node> child = std::move(n->children.begin()->second);
    n->children.clear();
    n->edge.insert(n->edge.end(), child->edge.begin(), child->edge.end());
    n->depth = child->depth;
    n->tick = std::max(n->tick, child->tick);
    n->checkpoint = child->checkpoint;
    if (n->checkpoint) node_of_[n->checkpoint->id] = n;
    n->children = std::move(child->children);
    for (auto& [t, c] : n->children) c->parent = n;
  }
}

void PrefixTree::Prune() {
  // Least recently seen leaves without a checkpoint first, until the paths fit; parents that
  // become bare leaves are considered in the next round.
  while (n_tokens_ > max_tokens_) {
    std::vector<Node*> leaves;
    std::function<void(Node*)> collect = [&](Node* n) {
      if (n != root_.get() && n->children.empty() && n->checkpoint == nullptr) leaves.push_back(n);
      for (auto& [t, c] : n->children) collect(c.get());
    };
    collect(root_.get());
    if (leaves.empty()) break;
    std::sort(leaves.begin(), leaves.end(), [](Node* a, Node* b) { return a->tick < b->tick; });
    for (Node* n : leaves) {
      if (n_tokens_ <= max_tokens_) break;
      Erase(n);  // leaves are distinct and nothing merges during the round: n is still valid
    }
  }
  Compact(root_.get());
}

}  // namespace ds::sched
