// Compiled constraints of one model, by key (the constraint's canonical text), least recently
// used first out. The masks a constraint has built stay with it, so a batch of requests with one
// schema builds each state's mask once. Thread-safe.
#pragma once

#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "base/status.h"
#include "grammar/compiled_grammar.h"
#include "grammar/nfa.h"
#include "grammar/vocabulary.h"

namespace hr::grammar {

class GrammarCache {
 public:
  // At most `capacity` constraints and about `max_bytes` of their automata and masks (the least
  // recently used go first; one still in use by a sequence lives on until it finishes).
  explicit GrammarCache(std::shared_ptr<const Vocabulary> vocab, size_t capacity = 128,
                        size_t max_bytes = size_t{1} << 30)
      : vocab_(std::move(vocab)), capacity_(capacity), max_bytes_(max_bytes) {}

  // The constraint for `key`, compiled by `build` when it is not cached.
  [[nodiscard]] Result<std::shared_ptr<CompiledGrammar>> get(
      const std::string& key, const std::function<Result<std::shared_ptr<const Nfa>>()>& build);

  const Vocabulary& vocabulary() const { return *vocab_; }
  int64_t hits() const;
  int64_t misses() const;

 private:
  void trim();  // under mu_: evicts down to the capacity and the memory budget

  std::shared_ptr<const Vocabulary> vocab_;
  size_t capacity_;
  size_t max_bytes_;
  mutable std::mutex mu_;
  std::list<std::pair<std::string, std::shared_ptr<CompiledGrammar>>> lru_;  // front: newest
  std::unordered_map<std::string, decltype(lru_)::iterator> index_;
  int64_t hits_ = 0, misses_ = 0;
};

}  // namespace hr::grammar
