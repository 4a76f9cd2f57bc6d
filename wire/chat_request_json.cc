// The chat request's JSON.
#include "wire/chat_request_json.h"

#include <cstdlib>
#include <type_traits>
#include <utility>

namespace hr::wire {

using nlohmann::json;

namespace {

// The JSON of `r`; moves its strings out when R is not an lvalue reference.
template <typename R>
json request_json(R&& r) {
  constexpr bool kMove = !std::is_lvalue_reference_v<R>;
  auto take = [](auto& s) -> decltype(auto) {
    if constexpr (kMove) {
      return std::move(s);
    } else {
      return static_cast<const std::remove_reference_t<decltype(s)>&>(s);
    }
  };
  json out = json::object();
  if (r.prompt) {
    out["prompt"] = take(*r.prompt);
  } else {
    json messages = json::array();
    for (auto& m : r.messages) {
      json msg = {{"role", take(m.role)}, {"content", take(m.content)}};
      if (!m.tool_calls.empty()) {
        json calls = json::array();
        for (auto& call : m.tool_calls) {
          calls.push_back(
              {{"id", take(call.id)},
               {"type", "function"},
               {"function", {{"name", take(call.name)}, {"arguments", take(call.arguments)}}}});
        }
        msg["tool_calls"] = std::move(calls);
      }
      if (m.tool_call_id) msg["tool_call_id"] = take(*m.tool_call_id);
      messages.push_back(std::move(msg));
    }
    out["messages"] = std::move(messages);
  }
  out["max_tokens"] = r.max_tokens;
  if (r.temperature) out["temperature"] = *r.temperature;
  if (r.top_p) out["top_p"] = *r.top_p;
  if (r.top_k) out["top_k"] = *r.top_k;
  if (r.seed) out["seed"] = *r.seed;
  if (r.stop) out["stop"] = take(*r.stop);
  if (r.frequency_penalty) out["frequency_penalty"] = *r.frequency_penalty;
  if (r.presence_penalty) out["presence_penalty"] = *r.presence_penalty;
  if (r.repetition_penalty) out["repetition_penalty"] = *r.repetition_penalty;
  if (!r.logit_bias.empty()) {
    json biases = json::object();
    for (const auto& [id, bias] : r.logit_bias) biases[std::to_string(id)] = bias;
    out["logit_bias"] = std::move(biases);
  }
  if (r.logprobs) {
    out["logprobs"] = true;
    out["top_logprobs"] = r.top_logprobs;
  }
  if (!r.tools.empty()) {
    json tools = json::array();
    for (auto& t : r.tools) {
      json fn = {{"name", take(t.name)}};
      if (!t.description.empty()) fn["description"] = take(t.description);
      // As text: an object here would lose the order of its keys.
      if (!t.parameters.empty()) fn["parameters"] = take(t.parameters);
      tools.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    out["tools"] = std::move(tools);
  }
  if (r.tool_choice == "function") {
    out["tool_choice"] = {{"type", "function"}, {"function", {{"name", r.tool_choice_function}}}};
  } else if (r.tool_choice != "auto") {
    out["tool_choice"] = r.tool_choice;
  }
  using RF = ResponseFormat::Type;
  if (r.response_format.type == RF::kJsonObject) out["response_format"] = {{"type", "json_object"}};
  if (r.response_format.type == RF::kJsonSchema) {
    json js = {{"name", r.response_format.name}, {"schema", r.response_format.schema}};
    if (r.response_format.strict) js["strict"] = true;
    out["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(js)}};
  }
  if (!r.parallel_tool_calls) out["parallel_tool_calls"] = false;
  return out;
}

}  // namespace

json to_json(const ChatRequest& r) { return request_json(r); }

json to_json(ChatRequest&& r) { return request_json(std::move(r)); }

namespace {

Status wrong(const std::string& field, const char* what) {
  return invalid_argument("'" + field + "' must be " + what, field);
}

Status read_number(const json& j, const char* key, std::optional<double>* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::ok();
  if (!it->is_number()) return wrong(key, "a number");
  *out = it->get<double>();
  return Status::ok();
}

}  // namespace

Result<ChatRequest> chat_request_from_json(const json& j) {
  if (!j.is_object()) return invalid_argument("a request must be a JSON object", "body");
  ChatRequest r;
  if (auto it = j.find("messages"); it != j.end()) {
    if (!it->is_array()) return wrong("messages", "an array");
    for (size_t i = 0; i < it->size(); ++i) {
      const json& m = (*it)[i];
      const std::string f = "messages[" + std::to_string(i) + "]";
      if (!m.is_object()) return wrong(f, "an object");
      auto role = m.find("role");
      auto content = m.find("content");
      if (role == m.end() || !role->is_string()) return wrong(f + ".role", "a string");
      if (content == m.end() || !content->is_string()) return wrong(f + ".content", "a string");
      ChatMessage msg{role->get<std::string>(), content->get<std::string>(), {}, std::nullopt};
      if (auto calls = m.find("tool_calls"); calls != m.end()) {
        if (!calls->is_array()) return wrong(f + ".tool_calls", "an array");
        for (size_t k = 0; k < calls->size(); ++k) {
          const json& call = (*calls)[k];
          const std::string cf = f + ".tool_calls[" + std::to_string(k) + "]";
          auto fn = call.find("function");
          if (!call.is_object() || fn == call.end() || !fn->is_object()) {
            return wrong(cf + ".function", "an object");
          }
          ToolCall tc;
          tc.id = call.value("id", "");
          tc.name = fn->value("name", "");
          tc.arguments = fn->value("arguments", "{}");
          msg.tool_calls.push_back(std::move(tc));
        }
      }
      if (auto id = m.find("tool_call_id"); id != m.end()) {
        if (!id->is_string()) return wrong(f + ".tool_call_id", "a string");
        msg.tool_call_id = id->get<std::string>();
      }
      r.messages.push_back(std::move(msg));
    }
  } else {
    auto it2 = j.find("prompt");
    if (it2 == j.end() || !it2->is_string()) return wrong("prompt", "a string");
    r.prompt = it2->get<std::string>();
  }
  if (auto it = j.find("max_tokens"); it != j.end()) {
    if (!it->is_number_integer()) return wrong("max_tokens", "an integer");
    r.max_tokens = it->get<int>();
  }
  HR_RETURN_IF_ERROR(read_number(j, "temperature", &r.temperature));
  HR_RETURN_IF_ERROR(read_number(j, "top_p", &r.top_p));
  HR_RETURN_IF_ERROR(read_number(j, "frequency_penalty", &r.frequency_penalty));
  HR_RETURN_IF_ERROR(read_number(j, "presence_penalty", &r.presence_penalty));
  HR_RETURN_IF_ERROR(read_number(j, "repetition_penalty", &r.repetition_penalty));
  if (auto it = j.find("top_k"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer()) return wrong("top_k", "an integer");
    r.top_k = it->get<int>();
  }
  if (auto it = j.find("seed"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0) {
      if (!it->is_number_unsigned()) return wrong("seed", "a non-negative integer");
    }
    r.seed = it->get<uint64_t>();
  }
  if (auto it = j.find("stop"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return wrong("stop", "an array of strings");
    std::vector<std::string> stops;
    for (const json& s : *it) {
      if (!s.is_string()) return wrong("stop", "an array of strings");
      stops.push_back(s.get<std::string>());
    }
    r.stop = std::move(stops);
  }
  if (auto it = j.find("logit_bias"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return wrong("logit_bias", "an object");
    for (const auto& [key, value] : it->items()) {
      const std::string f = "logit_bias." + key;
      char* end = nullptr;
      const long long id = std::strtoll(key.c_str(), &end, 10);
      if (key.empty() || *end != '\0') return wrong(f, "keyed by a token id");
      if (!value.is_number()) return wrong(f, "a number");
      r.logit_bias.emplace_back(id, value.get<double>());
    }
  }
  if (auto it = j.find("logprobs"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) return wrong("logprobs", "true or false");
    r.logprobs = it->get<bool>();
  }
  if (auto it = j.find("top_logprobs"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer()) return wrong("top_logprobs", "an integer");
    r.top_logprobs = it->get<int>();
  }
  if (auto it = j.find("tools"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return wrong("tools", "an array");
    for (size_t k = 0; k < it->size(); ++k) {
      const json& t = (*it)[k];
      const std::string f = "tools[" + std::to_string(k) + "]";
      auto fn = t.find("function");
      if (!t.is_object() || fn == t.end() || !fn->is_object() || !fn->contains("name") ||
          !(*fn)["name"].is_string()) {
        return wrong(f + ".function", "an object with a name");
      }
      Tool tool;
      tool.name = (*fn)["name"].get<std::string>();
      tool.description = fn->value("description", "");
      if (auto p = fn->find("parameters"); p != fn->end() && !p->is_null())
        tool.parameters = p->is_string() ? p->get<std::string>() : p->dump();
      r.tools.push_back(std::move(tool));
    }
  }
  if (auto it = j.find("tool_choice"); it != j.end() && !it->is_null()) {
    if (it->is_object()) {
      const json* fn = it->contains("function") ? &(*it)["function"] : nullptr;
      if (!fn || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string())
        return wrong("tool_choice.function.name", "a string");
      r.tool_choice = "function";
      r.tool_choice_function = (*fn)["name"].get<std::string>();
    } else if (it->is_string()) {
      r.tool_choice = it->get<std::string>();
    } else {
      return wrong("tool_choice", "a string or a function");
    }
  }
  if (auto it = j.find("response_format"); it != j.end() && !it->is_null()) {
    const std::string type = it->is_object() ? it->value("type", "") : "";
    if (type == "json_object") {
      r.response_format.type = ResponseFormat::Type::kJsonObject;
    } else if (type == "json_schema") {
      const json* js = it->contains("json_schema") ? &(*it)["json_schema"] : nullptr;
      if (!js || !js->is_object() || !js->contains("schema"))
        return wrong("response_format.json_schema.schema", "a JSON Schema");
      r.response_format.type = ResponseFormat::Type::kJsonSchema;
      r.response_format.name = js->value("name", "");
      r.response_format.strict = js->value("strict", false);
      const json& schema = (*js)["schema"];
      r.response_format.schema = schema.is_string() ? schema.get<std::string>() : schema.dump();
    } else if (type != "text") {
      return wrong("response_format.type", "text, json_object or json_schema");
    }
  }
  if (auto it = j.find("parallel_tool_calls"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) return wrong("parallel_tool_calls", "true or false");
    r.parallel_tool_calls = it->get<bool>();
  }
  return r;
}

Result<ChatRequest> parse_chat_request(std::string_view text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return invalid_argument("the stored request is not valid JSON", "body");
  return chat_request_from_json(j);
}

}  // namespace hr::wire
