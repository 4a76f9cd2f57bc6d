// The log probabilities of one answer, handed out as its text goes out: a token's entry once all
// of its text has gone (at the end, once any of it has; an entry without text waits for the text
// after it), so that the entries handed out spell the text sent so far, and none is left for text
// a stop string cut off. Offsets count the bytes of text each token decoded to
// (engine::TokenEvent::text_bytes), not the token's raw bytes, which differ for a stripped
// leading space, a special token or a replaced invalid byte.
#pragma once

#include <cstddef>
#include <deque>
#include <optional>
#include <vector>

#include "wire/answer.h"

namespace hr::workers {

class AnswerLogprobs {
 public:
  explicit AnswerLogprobs(bool wanted) : wanted_(wanted) {}
  bool wanted() const { return wanted_; }

  // One event of the answer, in order: its token's entry (none: a cancelled or failed end), the
  // bytes of text the token decoded to, the bytes of text the event sends, and whether it is the
  // last.
  void add(std::optional<wire::TokenLogprob> entry, int text_bytes, size_t sent_bytes,
           bool finished);
  // The entries handed out since the last call.
  std::vector<wire::TokenLogprob> take();
  // What is handed out and not taken yet, or nullopt when none were asked for.
  wire::Logprobs answer();

 private:
  struct Pending {
    wire::TokenLogprob entry;
    size_t start, end;  // its text in the decoded answer
  };
  bool wanted_;
  std::deque<Pending> pending_;
  std::vector<wire::TokenLogprob> released_;
  size_t decoded_ = 0, sent_ = 0;
};

}  // namespace hr::workers
