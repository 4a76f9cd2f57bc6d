// The router ↔ worker protocol.
#include "wire/worker_protocol.h"

#include "wire/chat_request_json.h"
#include "wire/json_text.h"
#include "wire/openai_chat.h"

namespace hr::wire {

using nlohmann::json;

std::string encode_forwarded_call(const ForwardedCall& call) {
  json j = {{"request", to_json(call.request)},
            {"stream", call.stream},
            {"reject_if_busy", call.reject_if_busy},
            {"queue_timeout_ms", call.queue_timeout_ms},
            {"cache_namespace", call.cache_namespace}};
  if (call.flex) {
    j["flex"] = true;
    j["flex_timeout_ms"] = call.flex_timeout_ms;
  }
  return j.dump();
}

Result<ForwardedCall> decode_forwarded_call(std::string_view text) {
  json body = parse_client_json(text);
  if (!body.is_object() || !body.contains("request") || !body["request"].is_object()) {
    return invalid_argument("body must be {\"request\": {...}}", "request");
  }
  ForwardedCall call;
  HR_ASSIGN_OR_RETURN(call.request, chat_request_from_json(body["request"]));
  auto flag = [&](const char* key) {
    return body.contains(key) && body[key].is_boolean() && body[key].get<bool>();
  };
  call.stream = flag("stream");
  call.reject_if_busy = flag("reject_if_busy");
  if (body.contains("queue_timeout_ms") && body["queue_timeout_ms"].is_number_integer()) {
    call.queue_timeout_ms = body["queue_timeout_ms"].get<int>();
  }
  if (body.contains("cache_namespace") && body["cache_namespace"].is_string()) {
    call.cache_namespace = body["cache_namespace"].get<std::string>();
  }
  call.flex = flag("flex");
  if (body.contains("flex_timeout_ms") && body["flex_timeout_ms"].is_number_integer()) {
    call.flex_timeout_ms = body["flex_timeout_ms"].get<int>();
  }
  return call;
}

json protocol_answer(const Answer& a) {
  json j = {{"text", a.text},
            {"finish_reason", a.finish_reason},
            {"prompt_tokens", a.usage.prompt_tokens},
            {"completion_tokens", a.usage.completion_tokens},
            {"cached_tokens", a.usage.cached_tokens}};
  if (a.logprobs) j["logprobs"] = logprobs_object(a.logprobs);
  if (!a.tool_calls.empty()) j["tool_calls"] = tool_calls_json(a.tool_calls);
  if (a.json) j["json"] = true;
  return j;
}

Result<Answer> answer_from_protocol(const json& j) {
  if (!j.is_object() || !j.contains("text") || !j["text"].is_string()) {
    return internal_error("malformed answer");
  }
  Answer a;
  a.text = j["text"];
  a.finish_reason = j.value("finish_reason", "");
  a.usage.prompt_tokens = j.value("prompt_tokens", int64_t{0});
  a.usage.completion_tokens = j.value("completion_tokens", int64_t{0});
  a.usage.cached_tokens = j.value("cached_tokens", int64_t{0});
  if (auto lp = j.find("logprobs"); lp != j.end() && lp->is_object() && lp->contains("content")) {
    Result<std::vector<TokenLogprob>> entries = logprob_entries_from_json((*lp)["content"]);
    if (!entries.is_ok())
      return internal_error("malformed logprobs: " + entries.status().message());
    a.logprobs = std::move(entries).value();
  }
  if (auto calls = j.find("tool_calls"); calls != j.end()) {
    Result<std::vector<ToolCall>> parsed = tool_calls_from_json(*calls);
    if (!parsed.is_ok())
      return internal_error("malformed tool calls: " + parsed.status().message());
    a.tool_calls = std::move(parsed).value();
  }
  a.json = j.value("json", false);
  return a;
}

std::string protocol_delta_line(const std::string& delta, const Logprobs& logprobs,
                                const std::vector<ToolCallDelta>& calls) {
  json line = {{"delta", delta}};
  if (logprobs) line["logprobs"] = logprob_entries(*logprobs);
  if (!calls.empty()) {
    json list = json::array();
    for (const ToolCallDelta& c : calls) {
      json d = {{"index", c.index}, {"arguments", c.arguments}};
      if (!c.id.empty()) d["id"] = c.id;
      if (!c.name.empty()) d["name"] = c.name;
      list.push_back(std::move(d));
    }
    line["tool_calls"] = std::move(list);
  }
  return line.dump();
}

Result<std::vector<ToolCallDelta>> delta_tool_calls_from_protocol(const json& line) {
  std::vector<ToolCallDelta> out;
  auto it = line.find("tool_calls");
  if (it == line.end()) return out;
  if (!it->is_array()) return internal_error("malformed tool call pieces");
  for (const json& d : *it) {
    if (!d.is_object() || !d.contains("index") || !d["index"].is_number_integer())
      return internal_error("malformed tool call piece");
    out.push_back(
        {d["index"].get<int>(), d.value("id", ""), d.value("name", ""), d.value("arguments", "")});
  }
  return out;
}

json protocol_error(const Status& st, bool retry_elsewhere) {
  json e = {{"code", status_code_name(st.code())}, {"message", st.message()}};
  if (!st.field().empty()) e["field"] = st.field();
  if (retry_elsewhere) e["retry_elsewhere"] = true;
  return {{"error", e}};
}

Status status_from_protocol_error(int http_status, const std::string& body) {
  json j = json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object()) {
    const json& e = j["error"];
    return Status(status_code_from_name(e.value("code", "internal")), e.value("message", ""),
                  e.value("field", ""));
  }
  return internal_error("worker answered HTTP " + std::to_string(http_status));
}

bool protocol_retry_elsewhere(const std::string& body) {
  json j = json::parse(body, nullptr, false);
  return j.is_object() && j.contains("error") && j["error"].is_object() &&
         j["error"].value("retry_elsewhere", false);
}

}  // namespace hr::wire
