// Lazy subset construction.
#include "grammar/dfa.h"

#include <algorithm>

namespace hr::grammar {

Dfa::Dfa(std::shared_ptr<const Nfa> nfa, size_t max_states)
    : nfa_(std::move(nfa)), max_states_(max_states), mark_(nfa_->size(), 0) {
  std::vector<int32_t> seeds = {nfa_->start()};
  intern(seeds);
}

size_t Dfa::memory_bytes() const {
  size_t bytes = trans_.size() * sizeof(trans_[0]) + info_.size() * sizeof(Info);
  for (const auto& s : sets_) bytes += s.size() * sizeof(int32_t) + 64;
  return bytes;
}

int32_t Dfa::intern(std::vector<int32_t>& seeds) {
  if (++generation_ == 0) {
    std::fill(mark_.begin(), mark_.end(), 0);
    generation_ = 1;
  }
  members_.clear();
  stack_.clear();
  for (int32_t s : seeds) {
    if (mark_[static_cast<size_t>(s)] != generation_) {
      mark_[static_cast<size_t>(s)] = generation_;
      stack_.push_back(s);
    }
  }
  while (!stack_.empty()) {
    const int32_t v = stack_.back();
    stack_.pop_back();
    const NfaNode& n = nfa_->node(v);
    // A node from which nothing is accepted is a dead end: the input must not go there.
    if ((!n.bytes.empty() || v == nfa_->accept()) && nfa_->dist(v) != kUnreachable)
      members_.push_back(v);
    for (int32_t t : n.eps) {
      if (mark_[static_cast<size_t>(t)] != generation_) {
        mark_[static_cast<size_t>(t)] = generation_;
        stack_.push_back(t);
      }
    }
  }
  if (members_.empty()) return kDead;
  std::sort(members_.begin(), members_.end());
  std::string key(reinterpret_cast<const char*>(members_.data()),
                  members_.size() * sizeof(int32_t));
  auto found = ids_.find(key);
  if (found != ids_.end()) return found->second;
  if (sets_.size() >= max_states_ && !sets_.empty()) return kDead;
  auto it = ids_.emplace(std::move(key), static_cast<int32_t>(sets_.size())).first;
  Info info;
  for (int32_t v : members_) {
    if (v == nfa_->accept()) info.accepting = true;
    if (!nfa_->node(v).bytes.empty()) info.open = true;
    info.dist = std::min(info.dist, nfa_->dist(v));
  }
  sets_.push_back(members_);
  trans_.emplace_back();
  trans_.back().fill(kUnknown);
  info_.push_back(info);
  return it->second;
}

int32_t Dfa::compute(int32_t state, uint8_t byte) {
  std::vector<int32_t> seeds;
  for (int32_t v : sets_[static_cast<size_t>(state)]) {
    for (const ByteEdge& e : nfa_->node(v).bytes) {
      if (byte >= e.lo && byte <= e.hi) seeds.push_back(e.to);
    }
  }
  if (seeds.empty()) return kDead;
  return intern(seeds);
}

}  // namespace hr::grammar
