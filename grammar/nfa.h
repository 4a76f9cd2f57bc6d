// A nondeterministic finite automaton over bytes, built by Thompson's construction: the form every
// constraint (a JSON Schema, a pattern, a tool call's wrapper) is compiled to before the lazy DFA
// (dfa.h) runs it. Fragments have one entry and one exit node; builders make a fresh copy per use.
// Recursion (a $ref to an enclosing schema, JSON values inside JSON values) is unrolled to a
// bounded depth by the compilers, so the language is finite-state and every token mask is exact and
// cacheable per state (token_mask.h).
#pragma once

#include <cstdint>
#include <limits>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace hr::grammar {

struct ByteEdge {
  uint8_t lo = 0, hi = 0;  // inclusive
  int32_t to = 0;
};

struct NfaNode {
  std::vector<ByteEdge> bytes;
  std::vector<int32_t> eps;
};

// A piece of automaton: enter at `in`, leave from `out` (a node with no edges yet).
struct Frag {
  int32_t in = 0;
  int32_t out = 0;
};

inline constexpr int32_t kUnreachable = std::numeric_limits<int32_t>::max();

class Nfa {
 public:
  // A limit on nodes, so that a hostile schema cannot take the server's memory.
  explicit Nfa(size_t max_nodes = 4'000'000) : max_nodes_(max_nodes) {}

  int32_t add_node();
  void add_bytes(int32_t from, uint8_t lo, uint8_t hi, int32_t to);
  void add_eps(int32_t from, int32_t to);
  // More nodes than the limit were asked for (every later node is a scratch one).
  bool overflowed() const { return overflowed_; }

  // Fragments.
  Frag empty();
  Frag literal(std::string_view bytes);
  Frag byte_range(uint8_t lo, uint8_t hi);
  Frag seq(Frag a, Frag b);
  Frag alt(const std::vector<Frag>& options);  // none: a fragment no input passes
  Frag opt(Frag a);
  Frag star(Frag a);  // zero or more
  // One code point in [lo, hi] as UTF-8 (surrogates excluded).
  Frag code_points(uint32_t lo, uint32_t hi);

  // Fixes the automaton: start and accept nodes, and each node's fewest bytes to accept
  // (kUnreachable when none). Fails when nothing is accepted at all.
  [[nodiscard]] Status finish(Frag whole);

  int32_t start() const { return start_; }
  int32_t accept() const { return accept_; }
  size_t size() const { return nodes_.size(); }
  const NfaNode& node(int32_t id) const { return nodes_[static_cast<size_t>(id)]; }
  int32_t dist(int32_t id) const { return dist_[static_cast<size_t>(id)]; }

 private:
  void add_utf8_range(int32_t from, int32_t to, uint32_t lo, uint32_t hi);

  size_t max_nodes_;
  bool overflowed_ = false;
  std::vector<NfaNode> nodes_;
  std::vector<int32_t> dist_;
  int32_t start_ = 0, accept_ = 0;
};

}  // namespace hr::grammar
