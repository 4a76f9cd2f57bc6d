// Log probabilities handed out with an answer's text.
#include "workers/answer_logprobs.h"

#include <algorithm>
#include <utility>

namespace hr::workers {

void AnswerLogprobs::add(std::optional<wire::TokenLogprob> entry, int text_bytes, size_t sent_bytes,
                         bool finished) {
  if (!wanted_) return;
  const size_t start = decoded_;
  decoded_ += static_cast<size_t>(std::max(0, text_bytes));
  if (entry) pending_.push_back({std::move(*entry), start, decoded_});
  sent_ += sent_bytes;
  // An entry goes once all of its text has gone. One without text (a special token, the first
  // bytes of a character) at the edge of what has gone waits for the text after it: that text
  // may still be cut. At the end, an entry goes if any of its text went, and one without text at
  // the edge goes only if nothing was cut.
  auto goes = [&](const Pending& p) {
    if (p.start == p.end && p.end == sent_) return finished && decoded_ == sent_;
    return p.end <= sent_ || (finished && p.start < sent_);
  };
  while (!pending_.empty() && goes(pending_.front())) {
    released_.push_back(std::move(pending_.front().entry));
    pending_.pop_front();
  }
  if (finished) pending_.clear();
}

std::vector<wire::TokenLogprob> AnswerLogprobs::take() { return std::exchange(released_, {}); }

wire::Logprobs AnswerLogprobs::answer() {
  if (!wanted_) return std::nullopt;
  return take();
}

}  // namespace hr::workers
