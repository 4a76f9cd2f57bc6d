// OpenAI's chat shapes.
#include "wire/openai_chat.h"

#include <cmath>
#include <limits>

namespace hr::wire {

using nlohmann::json;

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

Usage usage_from_json(const json& j) {
  Usage u;
  if (!j.is_object()) return u;
  auto count = [&](const json& obj, const char* key) {
    auto it = obj.find(key);
    return it != obj.end() && it->is_number_integer() ? it->get<int64_t>() : int64_t{0};
  };
  u.prompt_tokens = count(j, "prompt_tokens");
  u.completion_tokens = count(j, "completion_tokens");
  if (auto d = j.find("prompt_tokens_details"); d != j.end() && d->is_object()) {
    u.cached_tokens = count(*d, "cached_tokens");
  }
  return u;
}

namespace {

// The token's text as OpenAI shows it, and its bytes.
json token_shape(const std::string& raw, float logprob) {
  json bytes = json::array();
  for (unsigned char c : raw) bytes.push_back(static_cast<int>(c));
  std::string text = raw;
  try {
    (void)json(raw).dump();  // what the answer will go through
  } catch (const json::exception&) {
    static const char* kHex = "0123456789abcdef";
    text = "bytes:";
    for (unsigned char c : raw) text += std::string("\\x") + kHex[c >> 4] + kHex[c & 15];
  }
  // -inf (a token the logits gave no weight) has no JSON number: the lowest float stands in.
  return {{"token", std::move(text)},
          {"bytes", std::move(bytes)},
          {"logprob", std::isfinite(logprob) ? logprob : -std::numeric_limits<float>::max()}};
}

Result<std::string> bytes_of(const json& e, const std::string& field) {
  auto it = e.find("bytes");
  if (it == e.end() || !it->is_array()) {
    return invalid_argument("a logprobs entry needs its bytes", field + ".bytes");
  }
  std::string raw;
  for (const json& b : *it) {
    if (!b.is_number_integer() || b.get<int>() < 0 || b.get<int>() > 255) {
      return invalid_argument("a logprobs entry's bytes must be 0..255", field + ".bytes");
    }
    raw.push_back(static_cast<char>(b.get<int>()));
  }
  return raw;
}

Result<float> logprob_of(const json& e, const std::string& field) {
  auto it = e.find("logprob");
  if (it == e.end() || !it->is_number()) {
    return invalid_argument("a logprobs entry needs its logprob", field + ".logprob");
  }
  return it->get<float>();
}

}  // namespace

json logprob_entry(const TokenLogprob& t) {
  json entry = token_shape(t.bytes, t.logprob);
  json top = json::array();
  for (const TopLogprob& alt : t.top) top.push_back(token_shape(alt.bytes, alt.logprob));
  entry["top_logprobs"] = std::move(top);
  return entry;
}

json logprob_entries(const std::vector<TokenLogprob>& tokens) {
  json out = json::array();
  for (const TokenLogprob& t : tokens) out.push_back(logprob_entry(t));
  return out;
}

Result<std::vector<TokenLogprob>> logprob_entries_from_json(const json& j) {
  if (!j.is_array()) return invalid_argument("logprobs content must be an array", "logprobs");
  std::vector<TokenLogprob> out;
  out.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string f = "logprobs[" + std::to_string(i) + "]";
    if (!j[i].is_object()) return invalid_argument("a logprobs entry must be an object", f);
    TokenLogprob t;
    HR_ASSIGN_OR_RETURN(t.bytes, bytes_of(j[i], f));
    HR_ASSIGN_OR_RETURN(t.logprob, logprob_of(j[i], f));
    if (auto top = j[i].find("top_logprobs"); top != j[i].end() && top->is_array()) {
      for (size_t k = 0; k < top->size(); ++k) {
        const std::string tf = f + ".top_logprobs[" + std::to_string(k) + "]";
        TopLogprob alt;
        HR_ASSIGN_OR_RETURN(alt.bytes, bytes_of((*top)[k], tf));
        HR_ASSIGN_OR_RETURN(alt.logprob, logprob_of((*top)[k], tf));
        t.top.push_back(std::move(alt));
      }
    }
    out.push_back(std::move(t));
  }
  return out;
}

json logprobs_object(const Logprobs& logprobs) {
  if (!logprobs) return nullptr;
  return {{"content", logprob_entries(*logprobs)}, {"refusal", nullptr}};
}

json tool_calls_json(const std::vector<ToolCall>& calls) {
  json out = json::array();
  for (const ToolCall& c : calls) {
    out.push_back({{"id", c.id},
                   {"type", "function"},
                   {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  }
  return out;
}

Result<std::vector<ToolCall>> tool_calls_from_json(const json& j) {
  if (!j.is_array()) return invalid_argument("tool_calls must be an array", "tool_calls");
  std::vector<ToolCall> out;
  for (size_t k = 0; k < j.size(); ++k) {
    const json& c = j[k];
    auto fn = c.find("function");
    if (!c.is_object() || fn == c.end() || !fn->is_object()) {
      return invalid_argument("a tool call needs its function",
                              "tool_calls[" + std::to_string(k) + "].function");
    }
    out.push_back({c.value("id", ""), fn->value("name", ""), fn->value("arguments", "{}")});
  }
  return out;
}

nlohmann::ordered_json chat_completion(const Answer& a, const std::string& id, int64_t created,
                                       const std::string& model) {
  using ojson = nlohmann::ordered_json;
  ojson message = {{"role", "assistant"}, {"content", a.text}};
  if (!a.tool_calls.empty()) {
    if (a.text.empty()) message["content"] = nullptr;
    message["tool_calls"] = ojson(tool_calls_json(a.tool_calls));
  }
  ojson choice = {{"index", 0},
                  {"message", std::move(message)},
                  {"finish_reason", a.finish_reason},
                  {"logprobs", ojson(logprobs_object(a.logprobs))}};
  return {{"id", id},
          {"object", "chat.completion"},
          {"created", created},
          {"model", model},
          {"choices", ojson::array({std::move(choice)})},
          {"usage", ojson(usage_json(a.usage))}};
}

std::string chat_chunk_event(const std::string& id, int64_t created, const std::string& model,
                             json delta, json finish_reason, json usage, json logprobs,
                             const std::string& service_tier) {
  json chunk = {{"id", id},
                {"object", "chat.completion.chunk"},
                {"created", created},
                {"model", model},
                {"choices", json::array()}};
  if (!service_tier.empty()) chunk["service_tier"] = service_tier;
  if (!delta.is_null()) {
    chunk["choices"].push_back({{"index", 0},
                                {"delta", std::move(delta)},
                                {"finish_reason", std::move(finish_reason)},
                                {"logprobs", std::move(logprobs)}});
  }
  if (!usage.is_null()) chunk["usage"] = std::move(usage);
  return "data: " + chunk.dump() + "\n\n";
}

}  // namespace hr::wire
