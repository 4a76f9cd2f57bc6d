// OpenAI's batch output and error files: one JSONL line per ended request, rendered from what the
// queue stored (a stored answer, wire/stored_answer.h, or an error). Deterministic: a batch's
// results render to the same bytes every time. Pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace hr::wire {

// One ended request as the queue holds it.
struct StoredResult {
  int idx = 0;
  std::optional<std::string> custom_id;
  std::string status;                      // completed, failed, cancelled, expired
  std::optional<std::string> result_json;  // a stored answer (completed)
  std::optional<std::string> error_json;   // {"code", "message"} (failed)
  int64_t finished_at_s = 0;
};

// Appends the request's line to `output` (completed: {"id", "custom_id", "response":
// {"status_code", "request_id", "body": chat.completion}, "error": null}) or to `errors` (every
// other ending, and a completed one whose result is not a chat answer).
void append_result_line(const std::string& batch_id, const std::string& model,
                        const StoredResult& row, std::string* output, std::string* errors);

}  // namespace hr::wire
