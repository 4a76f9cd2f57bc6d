// The native answer: what a worker produced for one chat request, before any route gives it a
// shape. The store keeps it in a neutral, versioned JSON form (wire/stored_answer.h); the codecs
// render it as a Workers-AI result (wire/workers_ai.h), an OpenAI chat.completion or stream chunk
// (wire/openai_chat.h) or an OpenAI batch output line (wire/openai_batch_lines.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "wire/chat_request.h"

namespace hr::wire {

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // of the prompt, served from the prefix cache
};

// One alternative at a position: the token's bytes as the tokenizer has them (not necessarily
// UTF-8 on their own: part of a character, say) and its log probability (-inf allowed).
struct TopLogprob {
  std::string bytes;
  float logprob = 0;
};

// One answer token's log probability, with the most likely alternatives at its position.
struct TokenLogprob {
  std::string bytes;
  float logprob = 0;
  std::vector<TopLogprob> top;
};

// nullopt when the request did not ask for log probabilities; an empty list when it did.
using Logprobs = std::optional<std::vector<TokenLogprob>>;

// A piece of a tool call as an answer streams: the call's first piece names it (id and name, no
// arguments yet); later ones add to its arguments' text.
struct ToolCallDelta {
  int index = 0;
  std::string id;    // first piece only
  std::string name;  // first piece only
  std::string arguments;
};

struct Answer {
  std::string text;
  std::string finish_reason = "stop";  // stop, length, tool_calls
  std::vector<ToolCall> tool_calls;    // the functions the model called (finish_reason tool_calls)
  // The text is a JSON document the request's response_format asked for: Workers AI answers it
  // as a JSON value, not as a string.
  bool json = false;
  Usage usage;
  Logprobs logprobs;
};

}  // namespace hr::wire
