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

int32_t CompiledGrammar::walk(int32_t state, int32_t max_dist, uint32_t* bits, Entry* entry) {
  const int32_t own = dfa_.dist(state);
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
    if (entry && dist > own) entry->growing.push_back({id, dist});
    if (entry && dist < own) entry->shrinking.push_back({id, dist});
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
  e.max_next_dist = walk(state, kUnreachable, e.bits.data(), &e);
  std::sort(e.growing.begin(), e.growing.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  std::sort(e.shrinking.begin(), e.shrinking.end(),
            [](const auto& a, const auto& b) { return a.second < b.second; });
  e.growing.shrink_to_fit();
  e.shrinking.shrink_to_fit();
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
    } else if (dfa_.dist(state) <= budget) {
      // Every token but the growing ones keeps the distance within the budget: drop those that
      // would overrun it.
      ++stats_.masks_limited;
      std::memcpy(mask, e.bits.data(), words * sizeof(uint32_t));
      for (const auto& [id, d] : e.growing) {
        if (d <= budget) break;
        mask[id >> 5] &= ~(1u << (id & 31));
      }
    } else {
      ++stats_.masks_limited;
      bool any = false;
      if (dfa_.dist(state) == budget + 1) {
        // Every token must bring the end closer.
        for (const auto& [id, d] : e.shrinking) {
          if (d > budget) break;
          mask[id >> 5] |= 1u << (id & 31);
          any = true;
        }
      }
      // Not enough room (the budget was short from the start, or the vocabulary lacks a token
      // for some byte): at least get closer to the end, else anything the constraint allows.
      if (!any && !accepting) {
        for (const auto& [id, d] : e.shrinking) mask[id >> 5] |= 1u << (id & 31);
        any = !e.shrinking.empty();
      }
      if (!any && !accepting) std::memcpy(mask, e.bits.data(), words * sizeof(uint32_t));
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
  s.memory_bytes = dfa_.memory_bytes();
  for (const auto& [state, e] : cache_)
    s.memory_bytes += e.bits.size() * 4 + (e.growing.size() + e.shrinking.size()) * 8 + 64;
  return s;
}

}  // namespace hr::grammar
