// The stored answer.
#include "wire/stored_answer.h"

#include "wire/openai_chat.h"

namespace hr::wire {

using nlohmann::json;

std::string encode_stored_answer(const Answer& a) {
  json j = {{"v", kStoredAnswerVersion},
            {"text", a.text},
            {"finish_reason", a.finish_reason},
            {"usage",
             {{"prompt_tokens", a.usage.prompt_tokens},
              {"completion_tokens", a.usage.completion_tokens},
              {"cached_tokens", a.usage.cached_tokens}}}};
  if (a.logprobs) j["logprobs"] = logprob_entries(*a.logprobs);
  if (!a.tool_calls.empty()) j["tool_calls"] = tool_calls_json(a.tool_calls);
  if (a.json) j["json"] = true;
  return j.dump();
}

namespace {

// Workers AI's result, as releases before the versioned form stored it.
Result<Answer> decode_legacy(const json& j) {
  auto response = j.find("response");
  if (response == j.end() || !response->is_string()) {
    return invalid_argument("the stored result is not a chat answer", "result");
  }
  Answer a;
  a.text = response->get<std::string>();
  a.finish_reason = j.value("finish_reason", "stop");
  if (auto u = j.find("usage"); u != j.end()) a.usage = usage_from_json(*u);
  if (auto lp = j.find("logprobs"); lp != j.end() && lp->is_object()) {
    auto content = lp->find("content");
    if (content == lp->end()) return invalid_argument("logprobs without content", "logprobs");
    HR_ASSIGN_OR_RETURN(a.logprobs, logprob_entries_from_json(*content));
  }
  return a;
}

}  // namespace

Result<Answer> decode_stored_answer(std::string_view stored) {
  return decode_stored_answer_json(json::parse(stored, nullptr, false));
}

Result<Answer> decode_stored_answer_json(const json& j) {
  if (!j.is_object()) return invalid_argument("the stored result is not a chat answer", "result");
  auto v = j.find("v");
  if (v == j.end()) return decode_legacy(j);
  if (!v->is_number_integer()) return invalid_argument("the stored result's version", "result.v");
  if (v->get<int>() > kStoredAnswerVersion) {
    return Status(StatusCode::kFailedPrecondition, "the stored result is of a later version (" +
                                                       std::to_string(v->get<int>()) +
                                                       ") than this release reads");
  }
  auto text = j.find("text");
  if (text == j.end() || !text->is_string()) {
    return invalid_argument("the stored result has no text", "result.text");
  }
  Answer a;
  a.text = text->get<std::string>();
  a.finish_reason = j.value("finish_reason", "stop");
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    a.usage.prompt_tokens = u->value("prompt_tokens", int64_t{0});
    a.usage.completion_tokens = u->value("completion_tokens", int64_t{0});
    a.usage.cached_tokens = u->value("cached_tokens", int64_t{0});
  }
  if (auto lp = j.find("logprobs"); lp != j.end() && !lp->is_null()) {
    HR_ASSIGN_OR_RETURN(a.logprobs, logprob_entries_from_json(*lp));
  }
  if (auto calls = j.find("tool_calls"); calls != j.end()) {
    HR_ASSIGN_OR_RETURN(a.tool_calls, tool_calls_from_json(*calls));
  }
  a.json = j.value("json", false);
  return a;
}

}  // namespace hr::wire
