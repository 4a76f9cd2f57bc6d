// Workers AI's shapes.
#include "wire/workers_ai.h"

#include "wire/openai_chat.h"
#include "wire/stored_answer.h"

namespace hr::wire {

using nlohmann::json;

namespace {

// Workers AI's tool calls: [{"name", "arguments": {...}}].
json workers_ai_tool_calls(const std::vector<ToolCall>& calls) {
  json out = json::array();
  for (const ToolCall& c : calls) {
    json args = json::parse(c.arguments, nullptr, false);
    out.push_back(
        {{"name", c.name}, {"arguments", args.is_discarded() ? json(c.arguments) : args}});
  }
  return out;
}

}  // namespace

json workers_ai_result(const Answer& a, bool with_finish_reason) {
  json result = {{"response", a.text}, {"usage", usage_json(a.usage)}};
  // JSON mode: the document itself (as Workers AI answers it), when it parses.
  if (a.json && a.tool_calls.empty()) {
    json doc = json::parse(a.text, nullptr, false);
    if (!doc.is_discarded()) result["response"] = std::move(doc);
  }
  if (!a.tool_calls.empty()) result["tool_calls"] = workers_ai_tool_calls(a.tool_calls);
  if (with_finish_reason) result["finish_reason"] = a.finish_reason;
  if (a.logprobs) result["logprobs"] = logprobs_object(a.logprobs);
  return result;
}

Result<json> workers_ai_stored_result(std::string_view stored) {
  json j = json::parse(stored, nullptr, false);
  if (!j.is_object()) return invalid_argument("the stored result is not a chat answer", "result");
  if (!j.contains("v")) return j;  // as an earlier release stored it
  HR_ASSIGN_OR_RETURN(Answer a, decode_stored_answer_json(j));
  return workers_ai_result(a, true);
}

std::string workers_ai_delta_event(const std::string& delta, const Logprobs& logprobs) {
  json piece = {{"response", delta}};
  if (logprobs) piece["logprobs"] = logprobs_object(logprobs);
  return "data: " + piece.dump() + "\n\n";
}

std::string workers_ai_final_event(const Answer& a) {
  json last = {
      {"response", ""}, {"usage", usage_json(a.usage)}, {"finish_reason", a.finish_reason}};
  if (!a.tool_calls.empty()) last["tool_calls"] = workers_ai_tool_calls(a.tool_calls);
  return "data: " + last.dump() + "\n\n";
}

}  // namespace hr::wire
