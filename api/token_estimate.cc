// Token estimates before a request runs.
#include "api/token_estimate.h"

#include <algorithm>

namespace hr::api {

int64_t estimate_call_tokens(int64_t prompt_bytes, int64_t max_tokens) {
  return (prompt_bytes + 3) / 4 + std::max<int64_t>(0, max_tokens);
}

int64_t estimate_request_tokens(const wire::ChatRequest& request) {
  int64_t bytes = request.prompt ? static_cast<int64_t>(request.prompt->size()) : 0;
  for (const wire::ChatMessage& m : request.messages)
    bytes += static_cast<int64_t>(m.content.size());
  return estimate_call_tokens(bytes, request.max_tokens);
}

}  // namespace hr::api
