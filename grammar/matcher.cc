// Advancing a matcher.
#include "grammar/matcher.h"

namespace hr::grammar {

bool Matcher::accept(int32_t id) {
  if (ended_) return false;
  if (grammar_->vocabulary().is_stop(id)) {
    if (!grammar_->accepting(state_)) return false;
    ended_ = true;
    return true;
  }
  const int32_t next = grammar_->advance(state_, id);
  if (next == kDead) return false;
  state_ = next;
  return true;
}

}  // namespace hr::grammar
