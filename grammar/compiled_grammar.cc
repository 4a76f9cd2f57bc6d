// Token masks by walking the sorted vocabulary through the DFA.
#include "grammar/compiled_grammar.h"

#include <algorithm>
#include <cstring>

namespace hr::grammar {

namespace {
constexpr size_t kMaxMaskBytes = 256u << 20;  // per constraint
}

CompiledGrammar::CompiledGrammar(std::shared_ptr<const Nfa> nfa,
                                 std::shared_ptr<const Vocabulary> vocab)
    : vocab_(std::move(vocab)), dfa_(std::move(nfa)) {
  size_t longest = 0;
  for (int32_t id : vocab_->sorted()) longest = std::max(longest, vocab_->bytes(id).size());
  depth_state_.resize(longest + 1);
  max_cached_ =
      std::max<size_t>(16, kMaxMaskBytes / (static_cast<size_t>(vocab_->mask_words()) * 4));
}

int32_t CompiledGrammar::advance(int32_t state, int32_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state < 0 || id < 0 || id >= vocab_->num_tokens()) return kDead;
  for (char c : vocab_->bytes(id)) {
    state = dfa_.next(state, static_cast<uint8_t>(c));
    if (state < 0) return kDead;
  }
  return state;
}

bool CompiledGrammar::accepting(int32_t state) {
  std::lock_guard<std::mutex> lock(mu_);
  return dfa_.accepting(state);
}

bool CompiledGrammar::open(int32_t state) {
  std::lock_guard<std::mutex> lock(mu_);
  return dfa_.open(state);
}

int32_t CompiledGrammar::dist(int32_t state) {
  std::lock_guard<std::mutex> lock(mu_);
  return dfa_.dist(state);
}

int32_t CompiledGrammar::walk(int32_t state, int32_t max_dist, uint32_t* bits) {
  const std::vector<int32_t>& sorted = vocab_->sorted();
  const std::vector<uint16_t>& lcp = vocab_->common_prefix();
  int32_t largest = -1;
  depth_state_[0] = state;
  size_t reached = 0;  // bytes of the previous token that were walked
  bool failed = false;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const size_t common = lcp[i];
    // The previous token failed at byte `reached`: this one shares that byte, and fails too.
    if (failed && common > reached) continue;
    const int32_t id = sorted[i];
    const std::string& b = vocab_->bytes(id);
    size_t d = std::min(common, reached);
    int32_t st = depth_state_[d];
    failed = false;
    for (; d < b.size(); ++d) {
      st = dfa_.next(st, static_cast<uint8_t>(b[d]));
      if (st < 0) {
        failed = true;
        break;
      }
      depth_state_[d + 1] = st;
    }
    reached = d;
    if (failed) continue;
    const int32_t dist = dfa_.dist(st);
    if (dist > max_dist) continue;
    bits[id >> 5] |= 1u << (id & 31);
    largest = std::max(largest, dist);
  }
  return largest;
}

const CompiledGrammar::Entry& CompiledGrammar::entry(int32_t state) {
  auto it = cache_.find(state);
  if (it != cache_.end()) {
    ++stats_.masks_cached;
    return it->second;
  }
  ++stats_.masks_built;
  if (cache_.size() >= max_cached_) cache_.erase(cache_.begin());  // bounded memory
  Entry& e = cache_[state];
  e.bits.assign(static_cast<size_t>(vocab_->mask_words()), 0);
  e.max_next_dist = walk(state, kUnreachable, e.bits.data());
  return e;
}

void CompiledGrammar::fill_mask(int32_t state, int remaining, uint32_t* mask) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t words = static_cast<size_t>(vocab_->mask_words());
  std::memset(mask, 0, words * sizeof(uint32_t));
  if (state < 0) return;
  const bool accepting = dfa_.accepting(state);
  if (dfa_.open(state)) {
    const Entry& e = entry(state);
    // After this token, `remaining - 1` are left: enough for the rest of the document (one byte
    // per token at worst) and its stop token.
    const int64_t budget = remaining == kNoLimit ? kNoLimit : static_cast<int64_t>(remaining) - 2;
    if (e.max_next_dist <= budget) {
      std::memcpy(mask, e.bits.data(), words * sizeof(uint32_t));
    } else {
      ++stats_.masks_limited;
      int32_t found = budget >= 0 ? walk(state, static_cast<int32_t>(budget), mask) : -1;
      // Not enough room either way: at least get closer to the end.
      if (found < 0 && !accepting) found = walk(state, dfa_.dist(state) - 1, mask);
      if (found < 0 && !accepting) std::memcpy(mask, e.bits.data(), words * sizeof(uint32_t));
    }
  }
  if (accepting) {
    for (int32_t id : vocab_->stop_ids()) mask[id >> 5] |= 1u << (id & 31);
  }
}

CompiledGrammar::Stats CompiledGrammar::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s = stats_;
  s.states = dfa_.num_states();
  s.memory_bytes =
      dfa_.memory_bytes() + cache_.size() * (static_cast<size_t>(vocab_->mask_words()) * 4 + 64);
  return s;
}

}  // namespace hr::grammar
