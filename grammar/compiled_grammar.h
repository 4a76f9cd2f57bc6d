// A constraint ready to run against one vocabulary: its lazy DFA (dfa.h) and, per DFA state, the
// mask of the tokens allowed there, built the first time the state is reached and kept. Since
// recursion is unrolled (nfa.h), a state's mask never depends on anything but the state, so a
// cached mask is exact: a step costs one copy of the mask (XGrammar's adaptive token-mask cache,
// with nothing left to check at run time).
//
// The answer's length budget: each state knows its fewest bytes to completion, and each cached
// mask the largest such distance its tokens lead to. When the tokens left before max_tokens could
// run out before the document closes, the mask keeps only tokens after which it still can (one
// byte per token at worst, and a stop token at the end), so a constrained answer that stops by
// max_tokens is complete all the same, whenever max_tokens leaves room for the shortest document.
//
// Thread-safe: one lock per call (states and masks are shared by every sequence that uses the
// constraint).
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "grammar/dfa.h"
#include "grammar/nfa.h"
#include "grammar/vocabulary.h"

namespace hr::grammar {

inline constexpr int kNoLimit = std::numeric_limits<int>::max();

class CompiledGrammar {
 public:
  CompiledGrammar(std::shared_ptr<const Nfa> nfa, std::shared_ptr<const Vocabulary> vocab);

  const Vocabulary& vocabulary() const { return *vocab_; }
  int32_t start() const { return 0; }
  // The state after token `id` (its bytes), or kDead when the constraint forbids it there. Stop
  // tokens are the Matcher's business.
  int32_t advance(int32_t state, int32_t id);
  // The tokens allowed next, as bits (vocabulary().mask_words() words), when the answer may have
  // `remaining` more tokens counting this one (kNoLimit: no limit). Stop tokens where the document
  // may end.
  void fill_mask(int32_t state, int remaining, uint32_t* mask);
  bool accepting(int32_t state);
  // Whether more text may follow in `state` (else only a stop token).
  bool open(int32_t state);
  int32_t dist(int32_t state);

  struct Stats {
    int64_t masks_built = 0;    // walks of the vocabulary for a new state
    int64_t masks_cached = 0;   // steps served by a cached mask
    int64_t masks_limited = 0;  // steps near the length budget (a cached mask trimmed)
    size_t states = 0;
    size_t memory_bytes = 0;
  };
  Stats stats();

 private:
  struct Entry {
    std::vector<uint32_t> bits;
    int32_t max_next_dist = 0;
    // The allowed tokens after which the document is further from complete than before, farthest
    // first: near the length budget, the mask is this one less those that would overrun it.
    std::vector<std::pair<int32_t, int32_t>> growing;  // (token, distance after it)
    // The allowed tokens after which it is closer, nearest first: when every token left must make
    // progress, the mask is these (those within the budget).
    std::vector<std::pair<int32_t, int32_t>> shrinking;
    // Plain-text tokens (Vocabulary::plain_chars) of n characters all lead to one state when
    // `state` treats every plain character alike (inside a JSON string): they are not walked and
    // not listed above; (n, distance after them) for each n whose tokens are allowed.
    std::vector<std::pair<int32_t, int32_t>> plain;
  };
  const Entry& entry(int32_t state);
  // Sets in entry->bits the tokens that lead from `state` to a live state (but the plain tokens of
  // at most `skip_plain` characters), and lists the growing and shrinking ones; the largest
  // distance they lead to (-1 when none).
  int32_t walk(int32_t state, int skip_plain, Entry* entry);
  // The state every plain character leads to from `state` (kDead when none may follow), or
  // kNotUniform when they do not all lead to one.
  int32_t plain_successor(int32_t state);  // memoized
  int32_t uniform_plain_successor(int32_t state);
  static constexpr int32_t kNotUniform = -3;
  // Adds the entry's plain groups at most max_dist from completion; whether there were any.
  bool add_plain(const Entry& e, int64_t max_dist, uint32_t* mask) const;

  std::mutex mu_;
  std::shared_ptr<const Vocabulary> vocab_;
  Dfa dfa_;
  std::unordered_map<int32_t, Entry> cache_;
  size_t max_cached_;
  std::vector<int32_t> depth_state_;  // walk scratch: the state after each prefix length
  std::unordered_map<int32_t, int32_t> plain_next_;  // plain_successor's answers
  Stats stats_;
};

}  // namespace hr::grammar
