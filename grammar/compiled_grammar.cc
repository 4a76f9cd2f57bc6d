// Token masks by walking the sorted vocabulary through the DFA.
#include "grammar/compiled_grammar.h"

#include <algorithm>
#include <cstring>

namespace hr::grammar {

namespace {
constexpr size_t kMaxMaskBytes = 128u << 20;  // per constraint
// How many plain characters ahead a state's plain successors are followed (each new one costs a
// few thousand DFA transitions once).
constexpr int kPlainChain = 16;
}  // namespace

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

int32_t CompiledGrammar::plain_successor(int32_t state) {
  auto known = plain_next_.find(state);
  if (known != plain_next_.end()) return known->second;
  const int32_t found = uniform_plain_successor(state);
  plain_next_[state] = found;
  return found;
}

int32_t CompiledGrammar::uniform_plain_successor(int32_t state) {
  int32_t target = kNotUniform;
  bool first = true;
  auto same = [&](int32_t t) {
    if (first) {
      target = t;
      first = false;
      return true;
    }
    return t == target;
  };
  // ASCII: all but the controls, the quote and the backslash.
  for (int b = 0x20; b < 0x80; ++b) {
    if (b == '"' || b == '\\') continue;
    if (!same(dfa_.next(state, static_cast<uint8_t>(b)))) return kNotUniform;
  }
  // Longer characters: each lead byte, then its continuation bytes (the second one's range
  // depends on the lead), every distinct state reached checked once.
  struct Lead {
    int from, to, len, lo, hi;
  };
  static constexpr Lead kLeads[] = {{0xC2, 0xDF, 2, 0x80, 0xBF}, {0xE0, 0xE0, 3, 0xA0, 0xBF},
                                    {0xE1, 0xEC, 3, 0x80, 0xBF}, {0xED, 0xED, 3, 0x80, 0x9F},
                                    {0xEE, 0xEF, 3, 0x80, 0xBF}, {0xF0, 0xF0, 4, 0x90, 0xBF},
                                    {0xF1, 0xF3, 4, 0x80, 0xBF}, {0xF4, 0xF4, 4, 0x80, 0x8F}};
  for (const Lead& l : kLeads) {
    for (int lead = l.from; lead <= l.to; ++lead) {
      std::vector<int32_t> level = {dfa_.next(state, static_cast<uint8_t>(lead))};
      for (int k = 1; k < l.len; ++k) {
        std::vector<int32_t> next;
        for (int32_t u : level) {
          if (u < 0) {
            next.push_back(kDead);
            continue;
          }
          const int lo = k == 1 ? l.lo : 0x80, hi = k == 1 ? l.hi : 0xBF;
          for (int c = lo; c <= hi; ++c) {
            const int32_t v = dfa_.next(u, static_cast<uint8_t>(c));
            if (std::find(next.begin(), next.end(), v) == next.end()) next.push_back(v);
          }
        }
        level = std::move(next);
        if (level.size() > 1) return kNotUniform;
      }
      if (!same(level[0])) return kNotUniform;
    }
  }
  return target;
}

int32_t CompiledGrammar::walk(int32_t state, int skip_plain, Entry* entry) {
  const int32_t own = dfa_.dist(state);
  const std::vector<int32_t>& sorted = vocab_->sorted();
  const std::vector<uint16_t>& lcp = vocab_->common_prefix();
  int32_t largest = -1;
  depth_state_[0] = state;
  size_t reached = 0;  // bytes of the previous token that were walked
  bool failed = false;
  size_t since = SIZE_MAX;  // the common prefix with the last token walked, over those skipped
  for (size_t i = 0; i < sorted.size(); ++i) {
    const size_t common = std::min<size_t>(since, lcp[i]);
    const int32_t id = sorted[i];
    if (skip_plain > 0) {
      const int n = vocab_->plain_chars(id);
      if (n > 0 && n <= skip_plain) {
        since = common;
        continue;
      }
    }
    since = SIZE_MAX;
    // The previous token failed at byte `reached`: this one shares that byte, and fails too.
    if (failed && common > reached) continue;
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
    entry->bits[static_cast<size_t>(id) >> 5] |= 1u << (id & 31);
    largest = std::max(largest, dist);
    if (dist > own) entry->growing.push_back({id, dist});
    if (dist < own) entry->shrinking.push_back({id, dist});
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
  // Plain text: follow the plain-character successors as far as each is uniform.
  // Up to kPlainChain characters: longer plain tokens (rare) are walked.
  std::vector<int32_t> chain = {state};
  const int reach = std::min(vocab_->max_plain_chars(), kPlainChain);
  while (static_cast<int>(chain.size()) <= reach && chain.back() >= 0) {
    const int32_t next = plain_successor(chain.back());
    if (next == kNotUniform) break;
    if (next == chain.back()) {  // a loop (a string without a length limit): so it stays
      chain.resize(static_cast<size_t>(reach) + 1, next);
      break;
    }
    chain.push_back(next);
  }
  const int fast = static_cast<int>(chain.size()) - 1;  // token lengths the chain covers
  e.max_next_dist = walk(state, fast, &e);
  for (int n = 1; n <= fast; ++n) {
    const int32_t end = chain[static_cast<size_t>(n)];
    const std::vector<uint32_t>& group = vocab_->plain_mask(n);
    if (end < 0 || group.empty()) continue;
    for (size_t w = 0; w < group.size(); ++w) e.bits[w] |= group[w];
    const int32_t d = dfa_.dist(end);
    e.plain.push_back({n, d});
    e.max_next_dist = std::max(e.max_next_dist, d);
  }
  std::sort(e.growing.begin(), e.growing.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  std::sort(e.shrinking.begin(), e.shrinking.end(),
            [](const auto& a, const auto& b) { return a.second < b.second; });
  e.growing.shrink_to_fit();
  e.shrinking.shrink_to_fit();
  return e;
}

bool CompiledGrammar::add_plain(const Entry& e, int64_t max_dist, uint32_t* mask) const {
  bool any = false;
  for (const auto& [n, d] : e.plain) {
    if (d > max_dist) continue;
    const std::vector<uint32_t>& group = vocab_->plain_mask(n);
    for (size_t w = 0; w < group.size(); ++w) mask[w] |= group[w];
    any = true;
  }
  return any;
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
      for (const auto& [n, d] : e.plain) {
        if (d <= budget) continue;
        const std::vector<uint32_t>& group = vocab_->plain_mask(n);
        for (size_t w = 0; w < words; ++w) mask[w] &= ~group[w];
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
        any = add_plain(e, budget, mask) || any;
      }
      // Not enough room (the budget was short from the start, or the vocabulary lacks a token
      // for some byte): at least get closer to the end, else anything the constraint allows.
      if (!any && !accepting) {
        for (const auto& [id, d] : e.shrinking) mask[id >> 5] |= 1u << (id & 31);
        any = !e.shrinking.empty();
        any = add_plain(e, dfa_.dist(state) - 1, mask) || any;
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
