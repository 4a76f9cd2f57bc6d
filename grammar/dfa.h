// A DFA built lazily from an Nfa by subset construction: a state is the set of NFA nodes the input
// so far can have reached, made the first time some input reaches it, and each of its 256
// transitions is computed the first time it is taken. Each state knows whether it accepts, whether
// any byte may follow, and its fewest bytes to accept. Not thread-safe: the owner serializes.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/nfa.h"

namespace hr::grammar {

inline constexpr int32_t kDead = -1;

class Dfa {
 public:
  // At most max_states states (each takes about 1 KiB): input that would need another is treated
  // as leading nowhere, so a hostile constraint cannot take the worker's memory.
  explicit Dfa(std::shared_ptr<const Nfa> nfa, size_t max_states = 1 << 16);

  int32_t start() const { return 0; }
  // The state after `byte`, or kDead.
  int32_t next(int32_t state, uint8_t byte) {
    const int32_t t = trans_[static_cast<size_t>(state)][byte];
    if (t != kUnknown) return t;
    const int32_t computed = compute(state, byte);  // may grow trans_
    trans_[static_cast<size_t>(state)][byte] = computed;
    return computed;
  }
  bool accepting(int32_t state) const { return info_[static_cast<size_t>(state)].accepting; }
  // Whether some byte may follow (else only the end of the text).
  bool open(int32_t state) const { return info_[static_cast<size_t>(state)].open; }
  // Fewest bytes from `state` to an accepting state.
  int32_t dist(int32_t state) const { return info_[static_cast<size_t>(state)].dist; }
  size_t num_states() const { return sets_.size(); }
  size_t memory_bytes() const;

 private:
  static constexpr int32_t kUnknown = -2;
  struct Info {
    bool accepting = false;
    bool open = false;
    int32_t dist = kUnreachable;
  };
  int32_t compute(int32_t state, uint8_t byte);
  // The state for the epsilon closure of `seeds` (new or existing); kDead when empty.
  int32_t intern(std::vector<int32_t>& seeds);

  std::shared_ptr<const Nfa> nfa_;
  size_t max_states_;
  // NFA nodes with byte edges, or the accept node, that can still reach the accept node.
  std::vector<std::vector<int32_t>> sets_;
  std::vector<std::array<int32_t, 256>> trans_;
  std::vector<Info> info_;
  std::unordered_map<std::string, int32_t> ids_;
  std::vector<uint32_t> mark_;  // closure scratch: generation stamps per NFA node
  uint32_t generation_ = 0;
  std::vector<int32_t> stack_, members_;
};

}  // namespace hr::grammar
