// The log probabilities of one answer, handed out as its text goes out: a token's entry once all
// of its text has gone (at the end, once any of it has; an entry without text waits for the text
// after it), so that the entries handed out spell the text sent so far, and none is left for text
// a stop string cut off. Offsets count the bytes of
// text each token decoded to (engine::TokenEvent::text_bytes), not the token's raw bytes, which
// differ for a stripped leading space, a special token or a replaced invalid byte.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <deque>

namespace hr::workers {

class AnswerLogprobs {
 public:
  explicit AnswerLogprobs(bool wanted) : wanted_(wanted) {}
  bool wanted() const { return wanted_; }

  // One event of the answer, in order: its token's entry (null when it has none: a cancelled or
  // failed end), the bytes of text the token decoded to, the bytes of text the event sends, and
  // whether it is the last.
  void add(nlohmann::json entry, int text_bytes, size_t sent_bytes, bool finished);
  // The entries handed out since the last call (an array).
  nlohmann::json take();
  // OpenAI's logprobs object ({"content": [...], "refusal": null}) of what is handed out and not
  // taken yet, or null when none were asked for.
  nlohmann::json object();

 private:
  struct Pending {
    nlohmann::json entry;
    size_t start, end;  // its text in the decoded answer
  };
  bool wanted_;
  std::deque<Pending> pending_;
  nlohmann::json released_ = nlohmann::json::array();
  size_t decoded_ = 0, sent_ = 0;
};

}  // namespace hr::workers
