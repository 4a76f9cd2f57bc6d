// The LRU of compiled constraints.
#include "grammar/grammar_cache.h"

namespace hr::grammar {

Result<std::shared_ptr<CompiledGrammar>> GrammarCache::get(
    const std::string& key, const std::function<Result<std::shared_ptr<const Nfa>>()>& build) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it != index_.end()) {
      ++hits_;
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
    ++misses_;
  }
  // Compiled outside the lock: a slow schema does not hold up others.
  HR_ASSIGN_OR_RETURN(std::shared_ptr<const Nfa> nfa, build());
  auto compiled = std::make_shared<CompiledGrammar>(std::move(nfa), vocab_);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(key);
  if (it != index_.end()) return it->second->second;  // compiled meanwhile by another caller
  lru_.emplace_front(key, compiled);
  index_[key] = lru_.begin();
  trim();
  return compiled;
}

// On inserts only: a lookup stays cheap (it would otherwise lock every cached constraint to sum
// their sizes); between inserts a constraint grows within its own bounds (dfa.h, the mask cap).
void GrammarCache::trim() {
  size_t bytes = 0;
  for (auto& [key, g] : lru_) bytes += g->stats().memory_bytes;
  while (lru_.size() > 1 && (lru_.size() > capacity_ || bytes > max_bytes_)) {
    bytes -= std::min(bytes, lru_.back().second->stats().memory_bytes);
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
}

int64_t GrammarCache::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

int64_t GrammarCache::misses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return misses_;
}

}  // namespace hr::grammar
