// Log probabilities handed out with an answer's text.
#include "workers/answer_logprobs.h"

#include <algorithm>

namespace hr::workers {

using nlohmann::json;

void AnswerLogprobs::add(json entry, int text_bytes, size_t sent_bytes, bool finished) {
  if (!wanted_) return;
  const size_t start = decoded_;
  decoded_ += static_cast<size_t>(std::max(0, text_bytes));
  if (!entry.is_null()) pending_.push_back({std::move(entry), start, decoded_});
  sent_ += sent_bytes;
  while (!pending_.empty() && (pending_.front().end <= sent_ || (finished && pending_.front().start < sent_))) {
    released_.push_back(std::move(pending_.front().entry));
    pending_.pop_front();
  }
  if (finished) pending_.clear();
}

json AnswerLogprobs::take() {
  json out = std::move(released_);
  released_ = json::array();
  return out;
}

json AnswerLogprobs::object() {
  return wanted_ ? json{{"content", take()}, {"refusal", nullptr}} : json();
}

}  // namespace hr::workers
