// OpenAI's batch output and error lines.
#include "wire/openai_batch_lines.h"

#include <nlohmann/json.hpp>

#include "wire/openai_chat.h"
#include "wire/stored_answer.h"

namespace hr::wire {

using ojson = nlohmann::ordered_json;

namespace {

ojson error_of(const StoredResult& row) {
  if (row.error_json) {
    ojson e = ojson::parse(*row.error_json, nullptr, false);
    if (e.is_object() && e.contains("code") && e.contains("message")) {
      return {{"code", e["code"]}, {"message", e["message"]}};
    }
  }
  if (row.status == "cancelled") {
    return {{"code", "batch_cancelled"},
            {"message", "the batch was cancelled before this request ran"}};
  }
  if (row.status == "expired") {
    return {{"code", "batch_expired"},
            {"message", "the batch's completion window ended before this request ran"}};
  }
  return {{"code", "request_failed"}, {"message", "the request failed"}};
}

}  // namespace

void append_result_line(const std::string& batch_id, const std::string& model,
                        const StoredResult& row, std::string* output, std::string* errors) {
  std::string suffix = batch_id + "-" + std::to_string(row.idx);
  ojson line = {{"id", "batch_req_" + suffix},
                {"custom_id", row.custom_id ? ojson(*row.custom_id) : ojson(nullptr)}};
  if (row.status == "completed" && row.result_json) {
    if (Result<Answer> a = decode_stored_answer(*row.result_json); a.is_ok()) {
      line["response"] = {
          {"status_code", 200},
          {"request_id", "req_" + suffix},
          {"body", chat_completion(*a, "chatcmpl-" + suffix, row.finished_at_s, model)}};
      line["error"] = nullptr;
      output->append(line.dump());
      output->push_back('\n');
      return;
    }
  }
  line["response"] = nullptr;
  line["error"] =
      row.status == "completed"
          ? ojson{{"code", "invalid_result"}, {"message", "the stored result is not a chat answer"}}
          : error_of(row);
  errors->append(line.dump());
  errors->push_back('\n');
}

}  // namespace hr::wire
