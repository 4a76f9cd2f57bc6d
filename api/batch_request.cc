// Request validation.
#include "api/batch_request.h"

#include "api/token_estimate.h"

#include <cctype>
#include <cstdint>
#include <unordered_set>

#include "api/affinity.h"
#include "grammar/json_schema.h"
#include "queue/accounts.h"
#include "wire/chat_request_json.h"

namespace hr::api {
namespace {

using nlohmann::json;

Status bad(const std::string& msg, const std::string& field) {
  return invalid_argument(msg, field);
}

bool is_int(const json& v) { return v.is_number_integer() || v.is_number_unsigned(); }

// A message's text: a string, or OpenAI's array of content parts, of which only text parts
// ({"type": "text", "text": "..."}) are served; their texts are joined with newlines.
Result<std::string> message_text(const json& m, const std::string& field) {
  auto it = m.find("content");
  if (it == m.end() || !(it->is_string() || it->is_array())) {
    return bad("'content' must be a string or an array of text parts", field);
  }
  if (it->is_string()) return it->get<std::string>();
  if (it->empty()) return bad("'content' has no parts", field);
  std::string text;
  for (size_t j = 0; j < it->size(); ++j) {
    const json& part = (*it)[j];
    const std::string f = field + "[" + std::to_string(j) + "]";
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
      return bad("each content part must be an object with a string 'type'", f + ".type");
    }
    if (part["type"] != "text") {
      return bad("content parts of type '" + part["type"].get<std::string>() +
                     "' are not served: this model reads text parts only",
                 f + ".type");
    }
    if (!part.contains("text") || !part["text"].is_string()) {
      return bad("a text part's 'text' must be a string", f + ".text");
    }
    if (j > 0) text += "\n";
    text += part["text"].get<std::string>();
  }
  return text;
}

// A function name as OpenAI accepts it: 1 to 64 of a-z, A-Z, 0-9, _ and -.
bool valid_function_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_' && ch != '-') return false;
  }
  return true;
}

// An assistant message's tool_calls: [{"id", "type": "function", "function": {"name",
// "arguments": JSON text of an object}}].
Result<std::vector<wire::ToolCall>> message_tool_calls(const json& calls,
                                                       const std::string& field) {
  if (!calls.is_array()) return bad("'tool_calls' must be an array", field);
  std::vector<wire::ToolCall> out;
  for (size_t k = 0; k < calls.size(); ++k) {
    const json& c = calls[k];
    const std::string f = field + "[" + std::to_string(k) + "]";
    if (!c.is_object()) return bad("each tool call must be an object", f);
    if (!c.contains("id") || !c["id"].is_string())
      return bad("a tool call needs a string 'id'", f + ".id");
    if (c.contains("type") && c["type"] != "function")
      return bad("a tool call's type must be 'function'", f + ".type");
    if (!c.contains("function") || !c["function"].is_object()) {
      return bad("a tool call needs its 'function'", f + ".function");
    }
    const json& fn = c["function"];
    if (!fn.contains("name") || !fn["name"].is_string()) {
      return bad("a tool call needs the function's 'name'", f + ".function.name");
    }
    std::string arguments = "{}";
    if (fn.contains("arguments")) {
      if (!fn["arguments"].is_string()) {
        return bad("a tool call's 'arguments' must be a string of JSON", f + ".function.arguments");
      }
      json parsed = json::parse(fn["arguments"].get<std::string>(), nullptr, false);
      if (!parsed.is_object()) {
        return bad("a tool call's 'arguments' must be a JSON object", f + ".function.arguments");
      }
      arguments = fn["arguments"].get<std::string>();
    }
    out.push_back(
        {c["id"].get<std::string>(), fn["name"].get<std::string>(), std::move(arguments)});
  }
  return out;
}

// `tools`: OpenAI's [{"type": "function", "function": {"name", "description"?, "parameters"?}}],
// or Workers AI's [{"name", "description"?, "parameters"?}].
Status parse_tools(const json& tools, std::vector<wire::Tool>* out) {
  if (!tools.is_array()) return bad("'tools' must be an array of functions", "tools");
  if (tools.size() > 128) return bad("at most 128 tools", "tools");
  for (size_t k = 0; k < tools.size(); ++k) {
    const std::string f = "tools[" + std::to_string(k) + "]";
    const json& t = tools[k];
    if (!t.is_object()) return bad("each tool must be an object", f);
    const json* fn = &t;
    std::string prefix = f;
    if (t.contains("function") || t.contains("type")) {
      if (t.value("type", "") != "function")
        return bad("a tool's type must be 'function'", f + ".type");
      if (!t.contains("function") || !t["function"].is_object()) {
        return bad("a tool needs its 'function'", f + ".function");
      }
      fn = &t["function"];
      prefix = f + ".function";
    }
    if (!fn->contains("name") || !(*fn)["name"].is_string() ||
        !valid_function_name((*fn)["name"].get<std::string>())) {
      return bad("a function's name must be 1 to 64 letters, digits, _ or -", prefix + ".name");
    }
    wire::Tool tool;
    tool.name = (*fn)["name"].get<std::string>();
    for (const wire::Tool& other : *out) {
      if (other.name == tool.name)
        return bad("two tools are named '" + tool.name + "'", prefix + ".name");
    }
    if (fn->contains("description") && !(*fn)["description"].is_null()) {
      if (!(*fn)["description"].is_string()) {
        return bad("a function's description must be a string", prefix + ".description");
      }
      tool.description = (*fn)["description"].get<std::string>();
    }
    if (fn->contains("parameters") && !(*fn)["parameters"].is_null()) {
      if (!(*fn)["parameters"].is_object()) {
        return bad("a function's parameters must be a JSON Schema object", prefix + ".parameters");
      }
      tool.parameters = (*fn)["parameters"].dump();
    }
    out->push_back(std::move(tool));
  }
  return Status::ok();
}

// tool_choice: "auto", "none", "required" (the answer is calls to the tools) or a function
// ({"type": "function", "function": {"name"}}: the answer is a call to it).
Status parse_tool_choice(const json& choice, wire::ChatRequest* out) {
  if (choice.is_string()) {
    const std::string c = choice.get<std::string>();
    if (c == "auto" || c == "none" || c == "required") {
      out->tool_choice = c;
      return Status::ok();
    }
    return bad("tool_choice must be 'auto', 'none', 'required' or a function", "tool_choice");
  }
  if (!choice.is_object() || choice.value("type", "") != "function" ||
      !choice.contains("function") || !choice["function"].is_object() ||
      !choice["function"].contains("name") || !choice["function"]["name"].is_string()) {
    return bad(
        "tool_choice must be 'auto', 'none', 'required' or {\"type\": \"function\", "
        "\"function\": {\"name\": ...}}",
        "tool_choice");
  }
  const std::string name = choice["function"]["name"].get<std::string>();
  bool known = false;
  for (const wire::Tool& t : out->tools) known = known || t.name == name;
  if (!known)
    return bad("tool_choice names '" + name + "', which is not among the tools",
               "tool_choice.function.name");
  out->tool_choice = "function";
  out->tool_choice_function = name;
  return Status::ok();
}

// A schema the answer will be constrained to: compiled once here so that what the grammar engine
// does not support is refused at the edge, naming the keyword.
Status check_schema(const std::string& schema_text, const std::string& field) {
  auto schema = nlohmann::ordered_json::parse(schema_text, nullptr, false);
  if (schema.is_discarded()) return bad("the schema is not valid JSON", field);
  auto compiled = grammar::compile_json_schema(schema, field);
  if (!compiled.is_ok()) return compiled.status();
  return Status::ok();
}

// OpenAI's {"type": "text" | "json_object"} or {"type": "json_schema", "json_schema": {"name",
// "schema", "strict"?, "description"?}}; Workers AI's {"type": "json_schema", "json_schema":
// <the schema itself>}.
Status parse_response_format(const json& rf, wire::ResponseFormat* out) {
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
    return bad("response_format must be an object with a 'type'", "response_format");
  const std::string type = rf["type"].get<std::string>();
  for (const auto& [key, v] : rf.items()) {
    if (key != "type" && key != "json_schema")
      return bad("unknown field '" + key + "'", "response_format." + key);
  }
  if (type == "text") return Status::ok();
  if (type == "json_object") {
    out->type = wire::ResponseFormat::Type::kJsonObject;
    return Status::ok();
  }
  if (type != "json_schema")
    return bad("response_format.type must be 'text', 'json_object' or 'json_schema'",
               "response_format.type");
  if (!rf.contains("json_schema") || !rf["json_schema"].is_object())
    return bad("response_format json_schema needs its 'json_schema' object",
               "response_format.json_schema");
  const json& js = rf["json_schema"];
  const bool openai = js.contains("name") && js.contains("schema") && js["schema"].is_object();
  out->type = wire::ResponseFormat::Type::kJsonSchema;
  if (openai) {
    for (const auto& [key, v] : js.items()) {
      if (key != "name" && key != "schema" && key != "strict" && key != "description")
        return bad("unknown field '" + key + "'", "response_format.json_schema." + key);
    }
    if (!js["name"].is_string() || !valid_function_name(js["name"].get<std::string>()))
      return bad("the schema's name must be 1 to 64 letters, digits, _ or -",
                 "response_format.json_schema.name");
    out->name = js["name"].get<std::string>();
    if (js.contains("strict") && !js["strict"].is_null()) {
      if (!js["strict"].is_boolean())
        return bad("'strict' must be true or false", "response_format.json_schema.strict");
      out->strict = js["strict"].get<bool>();
    }
    out->schema = js["schema"].dump();
    return check_schema(out->schema, "response_format.json_schema.schema");
  }
  if (js.contains("schema") && !js.contains("type") && !js.contains("properties"))
    return bad("response_format.json_schema needs a 'name' beside its 'schema'",
               "response_format.json_schema.name");
  out->schema = js.dump();
  return check_schema(out->schema, "response_format.json_schema");
}

// The schemas as the client ordered their keys (the same values: only the order differs).
const nlohmann::ordered_json* member(const nlohmann::ordered_json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

void keep_schema_order(const nlohmann::ordered_json& req, std::vector<wire::Tool>* tools) {
  const nlohmann::ordered_json* list = member(req, "tools");
  if (!list || !list->is_array() || list->size() != tools->size()) return;
  for (size_t k = 0; k < tools->size(); ++k) {
    const nlohmann::ordered_json* fn = &(*list)[k];
    if (const nlohmann::ordered_json* f = member(*fn, "function")) fn = f;
    const nlohmann::ordered_json* params = member(*fn, "parameters");
    if (params && params->is_object() && !(*tools)[k].parameters.empty())
      (*tools)[k].parameters = params->dump();
  }
}

void keep_schema_order(const nlohmann::ordered_json& req, wire::ResponseFormat* rf) {
  if (rf->type != wire::ResponseFormat::Type::kJsonSchema) return;
  const nlohmann::ordered_json* f = member(req, "response_format");
  const nlohmann::ordered_json* js = f ? member(*f, "json_schema") : nullptr;
  if (!js) return;
  const nlohmann::ordered_json* schema = member(*js, "schema");
  // OpenAI's {name, schema} or Workers AI's bare schema, as parse_response_format decided.
  if (schema && schema->is_object() && member(*js, "name")) {
    rf->schema = schema->dump();
  } else if (!member(*js, "name")) {
    rf->schema = js->dump();
  }
}

}  // namespace

std::unique_ptr<nlohmann::ordered_json> ordered_schemas(std::string_view text) {
  if (text.find("\"tools\"") == std::string_view::npos &&
      text.find("\"response_format\"") == std::string_view::npos)
    return nullptr;
  auto j =
      std::make_unique<nlohmann::ordered_json>(nlohmann::ordered_json::parse(text, nullptr, false));
  if (j->is_discarded()) return nullptr;
  return j;
}

Result<wire::ChatRequest> normalize_chat_request(const json& req, const ModelSpec& model,
                                                 const BatchLimits& limits,
                                                 const nlohmann::ordered_json* ordered) {
  if (!req.is_object()) return bad("each request must be a JSON object", "");
  static const std::unordered_set<std::string> kKnown = {"messages",
                                                         "prompt",
                                                         "max_tokens",
                                                         "temperature",
                                                         "top_p",
                                                         "top_k",
                                                         "seed",
                                                         "stop",
                                                         "external_reference",
                                                         "custom_id",
                                                         "frequency_penalty",
                                                         "presence_penalty",
                                                         "repetition_penalty",
                                                         "stream",
                                                         "model",
                                                         "max_completion_tokens",
                                                         "logprobs",
                                                         "top_logprobs",
                                                         "logit_bias",
                                                         "tools",
                                                         "tool_choice",
                                                         "parallel_tool_calls",
                                                         "response_format"};
  for (const auto& [key, value] : req.items()) {
    if (!kKnown.count(key)) return bad("unknown field '" + key + "'", key);
  }
  wire::ChatRequest out;
  bool has_messages = req.contains("messages");
  bool has_prompt = req.contains("prompt");
  if (has_messages == has_prompt) {
    return bad("give exactly one of 'messages' or 'prompt'", has_messages ? "prompt" : "messages");
  }
  if (has_messages) {
    const json& msgs = req["messages"];
    if (!msgs.is_array() || msgs.empty())
      return bad("'messages' must be a non-empty array", "messages");
    std::vector<wire::ChatMessage> norm;
    norm.reserve(msgs.size());
    for (size_t i = 0; i < msgs.size(); ++i) {
      std::string f = "messages[" + std::to_string(i) + "]";
      const json& m = msgs[i];
      if (!m.is_object()) return bad("each message must be an object", f);
      if (!m.contains("role") || !m["role"].is_string())
        return bad("'role' must be a string", f + ".role");
      std::string role = m["role"];
      if (role != "system" && role != "user" && role != "assistant" && role != "tool" &&
          role != "developer") {
        return bad("role must be one of system, user, assistant, tool, developer", f + ".role");
      }
      wire::ChatMessage msg;
      const bool calls = m.contains("tool_calls") && !m["tool_calls"].is_null();
      if (calls && role != "assistant")
        return bad("only assistant messages carry tool_calls", f + ".tool_calls");
      if (calls) {
        HR_ASSIGN_OR_RETURN(msg.tool_calls, message_tool_calls(m["tool_calls"], f + ".tool_calls"));
      }
      if (calls && (!m.contains("content") || m["content"].is_null())) {
        msg.content = "";  // a call without text
      } else {
        HR_ASSIGN_OR_RETURN(msg.content, message_text(m, f + ".content"));
      }
      if (role == "tool") {
        if (!m.contains("tool_call_id") || !m["tool_call_id"].is_string()) {
          return bad("a tool message needs the 'tool_call_id' it answers", f + ".tool_call_id");
        }
        msg.tool_call_id = m["tool_call_id"].get<std::string>();
      }
      msg.role = std::move(role);
      norm.push_back(std::move(msg));
    }
    out.messages = std::move(norm);
  } else {
    if (!req["prompt"].is_string() || req["prompt"].get_ref<const std::string&>().empty()) {
      return bad("'prompt' must be a non-empty string", "prompt");
    }
    out.prompt = req["prompt"].get<std::string>();
  }
  // A prompt no tokenizer could fit in the model's context is refused here rather than stored
  // and failed by a worker. The API has no tokenizer, but a token spans at most
  // kMaxBytesPerToken bytes in the vocabularies served (runs of spaces are the longest), so
  // more bytes than the context's tokens times that cannot fit; the worker checks the rest.
  size_t prompt_bytes = out.prompt ? out.prompt->size() : 0;
  for (const wire::ChatMessage& m : out.messages) {
    prompt_bytes += m.content.size();
    for (const wire::ToolCall& c : m.tool_calls) prompt_bytes += c.arguments.size();
  }
  const size_t most = static_cast<size_t>(model.context_length) * kMaxBytesPerToken;
  if (prompt_bytes > most) {
    return bad("the prompt is " + std::to_string(prompt_bytes) + " bytes: more than model " +
                   model.name + "'s context of " + std::to_string(model.context_length) +
                   " tokens can hold (at most " + std::to_string(most) + " bytes)",
               has_messages ? "messages" : "prompt");
  }
  int max_tokens = std::min(256, model.context_length);
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    if (!req.contains(key) || req[key].is_null()) continue;
    if (!is_int(req[key])) return bad(std::string("'") + key + "' must be an integer", key);
    int64_t v = req[key].get<int64_t>();
    if (v < 1 || v > model.context_length) {
      return bad(std::string("'") + key + "' must be between 1 and the model's context length (" +
                     std::to_string(model.context_length) + ")",
                 key);
    }
    max_tokens = static_cast<int>(v);
  }
  out.max_tokens = max_tokens;
  auto number = [&](const char* key, double lo, double hi, double def) -> Result<double> {
    if (!req.contains(key) || req[key].is_null()) return def;
    if (!req[key].is_number()) return bad(std::string("'") + key + "' must be a number", key);
    double v = req[key].get<double>();
    if (v < lo || v > hi) {
      return bad(std::string("'") + key + "' must be between " + std::to_string(lo) + " and " +
                     std::to_string(hi),
                 key);
    }
    return v;
  };
  HR_ASSIGN_OR_RETURN(double temperature, number("temperature", 0.0, 5.0, 0.6));
  HR_ASSIGN_OR_RETURN(double top_p, number("top_p", 0.0, 1.0, 1.0));
  HR_ASSIGN_OR_RETURN(double fp, number("frequency_penalty", -2.0, 2.0, 0.0));
  HR_ASSIGN_OR_RETURN(double pp, number("presence_penalty", -2.0, 2.0, 0.0));
  // Below 0.01 a repetition penalty would only blow logits up (to infinity as it nears 0).
  HR_ASSIGN_OR_RETURN(double rp, number("repetition_penalty", 0.01, 2.0, 1.0));
  if (top_p == 0.0) return bad("'top_p' must be greater than 0", "top_p");
  // Defaults are the worker's; only what the caller set is stored.
  auto given = [&](const char* key) { return req.contains(key) && !req[key].is_null(); };
  if (given("temperature")) out.temperature = temperature;
  if (given("top_p")) out.top_p = top_p;
  if (given("frequency_penalty") && fp != 0.0) out.frequency_penalty = fp;
  if (given("presence_penalty") && pp != 0.0) out.presence_penalty = pp;
  if (given("repetition_penalty") && rp != 1.0) out.repetition_penalty = rp;
  if (req.contains("top_k") && !req["top_k"].is_null()) {
    if (!is_int(req["top_k"]) || req["top_k"].get<int64_t>() < 0 ||
        req["top_k"].get<int64_t>() > 1000) {
      return bad("'top_k' must be an integer between 0 and 1000", "top_k");
    }
    out.top_k = req["top_k"].get<int>();
  }
  if (req.contains("seed") && !req["seed"].is_null()) {
    if (!is_int(req["seed"]) || req["seed"].get<int64_t>() < 0) {
      return bad("'seed' must be a non-negative integer", "seed");
    }
    out.seed = req["seed"].get<uint64_t>();
  }
  if (req.contains("stop") && !req["stop"].is_null()) {
    const json& s = req["stop"];
    std::vector<std::string> stops;
    if (s.is_string()) {
      stops.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      for (const auto& e : s) {
        if (!e.is_string() || e.get_ref<const std::string&>().empty()) {
          return bad("'stop' entries must be non-empty strings", "stop");
        }
        stops.push_back(e.get<std::string>());
      }
    } else {
      return bad("'stop' must be a string or an array of strings", "stop");
    }
    if (static_cast<int>(stops.size()) > limits.max_stop_sequences) {
      return bad("at most " + std::to_string(limits.max_stop_sequences) + " stop sequences",
                 "stop");
    }
    out.stop = std::move(stops);
  }
  // OpenAI's: token id (in decimal, as a string) → bias in [-100, 100], added to its logit. Ids
  // past the model's vocabulary are refused by the worker, which knows it.
  if (given("logit_bias")) {
    const json& lb = req["logit_bias"];
    if (!lb.is_object())
      return bad("'logit_bias' must be an object of token ids to biases", "logit_bias");
    if (lb.size() > 300) return bad("'logit_bias' may bias 300 tokens at most", "logit_bias");
    for (const auto& [key, value] : lb.items()) {
      const std::string f = "logit_bias." + key;
      const bool canonical = !key.empty() && key.size() <= 10 &&
                             key.find_first_not_of("0123456789") == std::string::npos &&
                             (key == "0" || key[0] != '0') && std::stoll(key) <= INT32_MAX;
      if (!canonical) return bad("'logit_bias' keys must be token ids (0, 1, 2, ...)", f);
      if (!value.is_number() || value.get<double>() < -100.0 || value.get<double>() > 100.0) {
        return bad("a logit bias must be a number between -100 and 100", f);
      }
      if (value.get<double>() != 0.0)
        out.logit_bias.emplace_back(std::stoll(key), value.get<double>());
    }
  }
  // OpenAI's: the answer's tokens' log probabilities, each with up to 20 of the most likely.
  bool logprobs = false;
  if (given("logprobs")) {
    if (!req["logprobs"].is_boolean()) return bad("'logprobs' must be true or false", "logprobs");
    logprobs = req["logprobs"].get<bool>();
  }
  if (given("top_logprobs")) {
    const json& k = req["top_logprobs"];
    if (!is_int(k) || k.get<int64_t>() < 0 || k.get<int64_t>() > 20) {
      return bad("'top_logprobs' must be an integer between 0 and 20", "top_logprobs");
    }
    if (k.get<int64_t>() > 0 && !logprobs)
      return bad("'top_logprobs' needs 'logprobs': true", "top_logprobs");
  }
  if (logprobs) {
    out.logprobs = true;
    out.top_logprobs = given("top_logprobs") ? req["top_logprobs"].get<int>() : 0;
  }
  if (req.contains("stream") && !req["stream"].is_null() &&
      !(req["stream"].is_boolean() && !req["stream"].get<bool>())) {
    return bad("queued requests cannot stream", "stream");
  }
  if (req.contains("model") && !req["model"].is_null() &&
      (!req["model"].is_string() || req["model"].get<std::string>() != model.name)) {
    return bad("'model' must match the batch's model " + model.name, "model");
  }
  if (given("tools")) HR_RETURN_IF_ERROR(parse_tools(req["tools"], &out.tools));
  if (ordered) keep_schema_order(*ordered, &out.tools);
  if (given("tool_choice")) HR_RETURN_IF_ERROR(parse_tool_choice(req["tool_choice"], &out));
  if (out.tool_choice == "required" || out.tool_choice == "function") {
    if (out.tools.empty())
      return bad("tool_choice '" + out.tool_choice + "' needs tools", "tool_choice");
    // The call's arguments are constrained to the function's parameters: each must compile.
    for (size_t k = 0; k < out.tools.size(); ++k) {
      const wire::Tool& t = out.tools[k];
      if (t.parameters.empty()) continue;
      if (out.tool_choice == "function" && t.name != out.tool_choice_function) continue;
      HR_RETURN_IF_ERROR(
          check_schema(t.parameters, "tools[" + std::to_string(k) + "].function.parameters"));
    }
  }
  if (given("response_format"))
    HR_RETURN_IF_ERROR(parse_response_format(req["response_format"], &out.response_format));
  if (ordered) keep_schema_order(*ordered, &out.response_format);
  if (given("parallel_tool_calls")) {
    if (!req["parallel_tool_calls"].is_boolean()) {
      return bad("'parallel_tool_calls' must be true or false", "parallel_tool_calls");
    }
    out.parallel_tool_calls = req["parallel_tool_calls"].get<bool>();
  }
  return out;
}

namespace {

Result<int> parse_priority(const json& value, const std::string& field) {
  const std::string range =
      std::to_string(queue::kMinPriority) + " to " + std::to_string(queue::kMaxPriority);
  int64_t p = 0;
  if (value.is_number_integer()) {
    p = value.get<int64_t>();
  } else if (value.is_string()) {
    const std::string& text = value.get_ref<const std::string&>();
    size_t used = 0;
    try {
      p = std::stoll(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != text.size()) {
      return invalid_argument("'" + field + "' must be an integer, " + range, field);
    }
  } else {
    return invalid_argument("'" + field + "' must be an integer, " + range, field);
  }
  if (p < queue::kMinPriority || p > queue::kMaxPriority) {
    return invalid_argument("'" + field + "' must be " + range, field);
  }
  return static_cast<int>(p);
}

}  // namespace

Result<std::optional<int>> batch_priority(std::initializer_list<PriorityPlace> places) {
  std::optional<int> out;
  for (const PriorityPlace& place : places) {
    if (place.object == nullptr || !place.object->is_object()) continue;
    auto it = place.object->find("priority");
    if (it == place.object->end()) continue;
    HR_ASSIGN_OR_RETURN(out, parse_priority(*it, std::string(place.prefix) + "priority"));
  }
  return out;
}

std::optional<BatchError> check_batch_envelope(const json& body, const BatchLimits& limits) {
  if (!body.is_object()) return BatchError{bad("body must be a JSON object", ""), std::nullopt};
  if (!body.contains("requests")) {
    return BatchError{bad("'requests' is required when queueRequest is true", "requests"),
                      std::nullopt};
  }
  const json& reqs = body["requests"];
  if (!reqs.is_array())
    return BatchError{bad("'requests' must be an array", "requests"), std::nullopt};
  if (reqs.empty())
    return BatchError{bad("'requests' must not be empty", "requests"), std::nullopt};
  if (static_cast<int64_t>(reqs.size()) > limits.max_requests) {
    return BatchError{Status(StatusCode::kTooLarge,
                             "a batch holds at most " + std::to_string(limits.max_requests) +
                                 " requests; this one has " + std::to_string(reqs.size()),
                             "requests"),
                      std::nullopt};
  }
  return std::nullopt;
}

std::optional<BatchError> parse_batch_request(const json& reqs, size_t i, const ModelSpec& model,
                                              const BatchLimits& limits,
                                              std::unordered_set<std::string>* seen,
                                              queue::NewRequest* out,
                                              const nlohmann::ordered_json* ordered_reqs) {
  int idx = static_cast<int>(i);
  const json& req = reqs[i];
  const nlohmann::ordered_json* ordered =
      ordered_reqs && ordered_reqs->is_array() && i < ordered_reqs->size() ? &(*ordered_reqs)[i]
                                                                           : nullptr;
  Result<wire::ChatRequest> norm = normalize_chat_request(req, model, limits, ordered);
  if (!norm.is_ok()) {
    const Status& s = norm.status();
    std::string field = "requests[" + std::to_string(i) + "]";
    if (!s.field().empty()) field += "." + s.field();
    return BatchError{Status(s.code(), s.message(), field), idx};
  }
  out->custom_id.reset();
  for (const char* key : {"external_reference", "custom_id"}) {
    if (!req.contains(key) || req[key].is_null()) continue;
    std::string field = "requests[" + std::to_string(i) + "]." + key;
    if (!req[key].is_string()) {
      return BatchError{bad(std::string("'") + key + "' must be a string", field), idx};
    }
    const std::string& ref = req[key].get_ref<const std::string&>();
    if (ref.empty() || static_cast<int>(ref.size()) > limits.max_reference_length) {
      return BatchError{bad(std::string("'") + key + "' must be 1 to " +
                                std::to_string(limits.max_reference_length) + " characters",
                            field),
                        idx};
    }
    if (out->custom_id && *out->custom_id != ref) {
      return BatchError{bad("external_reference and custom_id differ", field), idx};
    }
    if (!out->custom_id && !seen->insert(ref).second) {
      return BatchError{bad("duplicate " + std::string(key) + " '" + ref + "'", field), idx};
    }
    out->custom_id = ref;
  }
  out->tokens = estimate_request_tokens(*norm);
  out->affinity = prefix_affinity(*norm);
  out->body = wire::to_json(std::move(norm).value()).dump();
  return std::nullopt;
}

std::optional<BatchError> parse_batch(const json& body, const ModelSpec& model,
                                      const BatchLimits& limits,
                                      std::vector<queue::NewRequest>* out) {
  if (auto err = check_batch_envelope(body, limits)) return err;
  const json& reqs = body["requests"];
  out->clear();
  out->reserve(reqs.size());
  std::unordered_set<std::string> seen;
  for (size_t i = 0; i < reqs.size(); ++i) {
    queue::NewRequest nr;
    if (auto err = parse_batch_request(reqs, i, model, limits, &seen, &nr)) return err;
    out->push_back(std::move(nr));
  }
  return std::nullopt;
}

}  // namespace hr::api
