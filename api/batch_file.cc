// Input file validation.
#include "api/batch_file.h"

#include <cstring>

#include "api/affinity.h"
#include "api/errors.h"
#include "api/token_estimate.h"
#include "wire/chat_request_json.h"
#include "wire/json_text.h"

namespace hr::api {
namespace {

using nlohmann::json;

bool is_blank(std::string_view s) {
  for (char c : s) {
    if (c != ' ' && c != '\t' && c != '\r') return false;
  }
  return true;
}

// Calls fn(line_number, text) for each non-blank line.
template <typename Fn>
void for_each_line(std::string_view content, Fn&& fn) {
  int number = 0;
  size_t p = 0;
  while (p < content.size()) {
    const void* nl = std::memchr(content.data() + p, '\n', content.size() - p);
    size_t end =
        nl ? static_cast<size_t>(static_cast<const char*>(nl) - content.data()) : content.size();
    ++number;
    std::string_view text = content.substr(p, end - p);
    if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
    if (!is_blank(text)) fn(number, text);
    p = end + 1;
  }
}

}  // namespace

std::vector<InputLine> split_jsonl(std::string_view content) {
  std::vector<InputLine> out;
  for_each_line(content, [&](int number, std::string_view text) { out.push_back({number, text}); });
  return out;
}

int count_jsonl_lines(std::string_view content) {
  int n = 0;
  for_each_line(content, [&](int, std::string_view) { ++n; });
  return n;
}

json errors_object(const std::vector<LineError>& errors) {
  json data = json::array();
  for (const LineError& e : errors) {
    data.push_back({{"code", e.code},
                    {"message", e.message},
                    {"param", e.param.empty() ? json(nullptr) : json(e.param)},
                    {"line", e.line ? json(*e.line) : json(nullptr)}});
  }
  return {{"object", "list"}, {"data", std::move(data)}};
}

InputValidator::InputValidator(const std::vector<ModelSpec>& models, const BatchLimits& limits,
                               std::string endpoint)
    : models_(models), limits_(limits), endpoint_(std::move(endpoint)) {}

const ModelSpec* InputValidator::pick_model(const std::vector<InputLine>& lines) {
  for (const InputLine& line : lines) {
    json j = wire::parse_client_json(line.text);
    if (!j.is_object() || !j.contains("body") || !j["body"].is_object()) continue;
    const json& m = j["body"].contains("model") ? j["body"]["model"] : json();
    if (!m.is_string()) continue;
    for (const ModelSpec& spec : models_) {
      if (spec.name == m.get_ref<const std::string&>()) {
        model_ = &spec;
        return model_;
      }
    }
  }
  return nullptr;
}

std::optional<LineError> InputValidator::check(const InputLine& in, queue::NewRequest* out) {
  auto error = [&](const char* code, std::string message, std::string param) {
    return LineError{code, "line " + std::to_string(in.line) + ": " + message, std::move(param),
                     in.line};
  };
  std::string why;
  json j = wire::parse_client_json(in.text, &why);
  if (j.is_discarded())
    return error("invalid_json_line", why.rfind("is ", 0) == 0 ? why.substr(3) : why, "");
  if (!j.is_object()) return error("invalid_json_line", "must be a JSON object", "");
  for (const auto& [key, value] : j.items()) {
    if (key != "custom_id" && key != "method" && key != "url" && key != "body") {
      return error("invalid_request", "unknown field '" + key + "'", key);
    }
  }
  if (!j.contains("custom_id") || j["custom_id"].is_null()) {
    return error("missing_required_parameter", "'custom_id' is required", "custom_id");
  }
  if (!j["custom_id"].is_string()) {
    return error("invalid_custom_id", "'custom_id' must be a string", "custom_id");
  }
  std::string custom_id = j["custom_id"];
  if (custom_id.empty() || static_cast<int>(custom_id.size()) > limits_.max_reference_length) {
    return error(
        "invalid_custom_id",
        "'custom_id' must be 1 to " + std::to_string(limits_.max_reference_length) + " characters",
        "custom_id");
  }
  auto [seen, inserted] = seen_.emplace(custom_id, in.line);
  if (!inserted) {
    return error(
        "duplicate_custom_id",
        "custom_id '" + custom_id + "' is already used on line " + std::to_string(seen->second),
        "custom_id");
  }
  if (!j.contains("method")) {
    return error("missing_required_parameter", "'method' is required", "method");
  }
  if (j["method"] != "POST") return error("invalid_method", "'method' must be POST", "method");
  if (!j.contains("url")) return error("missing_required_parameter", "'url' is required", "url");
  if (!j["url"].is_string() || j["url"] != endpoint_) {
    return error("invalid_url", "'url' must be " + endpoint_ + ", the batch's endpoint", "url");
  }
  if (!j.contains("body")) return error("missing_required_parameter", "'body' is required", "body");
  json& body = j["body"];
  if (!body.is_object()) return error("invalid_request", "'body' must be an object", "body");
  if (!body.contains("model") || !body["model"].is_string()) {
    return error("missing_required_parameter", "'body.model' is required", "body.model");
  }
  const std::string& name = body["model"].get_ref<const std::string&>();
  const ModelSpec* spec = nullptr;
  for (const ModelSpec& m : models_) {
    if (m.name == name) spec = &m;
  }
  if (spec == nullptr) {
    return error("model_not_found", "model '" + name + "' is not served here", "body.model");
  }
  if (model_ != nullptr && spec != model_) {
    return error("mismatched_model",
                 "every request of a batch must use the same model; this batch uses '" +
                     model_->name + "', this line '" + name + "'",
                 "body.model");
  }
  model_ = spec;
  // One answer per request: a batch line asking for more must not silently get one.
  if (body.contains("n") && !body["n"].is_null() && body["n"] != 1) {
    return error("invalid_request", "only n = 1 is supported", "body.n");
  }
  // OpenAI fields this server does not use but clients commonly send (as on the sync route).
  for (const char* key : {"n", "user", "stream_options"}) body.erase(key);
  const std::unique_ptr<nlohmann::ordered_json> ordered = ordered_schemas(in.text);
  const nlohmann::ordered_json* ordered_body =
      ordered && ordered->is_object() && ordered->contains("body") ? &(*ordered)["body"] : nullptr;
  Result<wire::ChatRequest> norm = normalize_chat_request(body, *spec, limits_, ordered_body);
  if (!norm.is_ok()) {
    const Status& s = norm.status();
    return error("invalid_request", s.message(), s.field().empty() ? "body" : "body." + s.field());
  }
  out->custom_id = std::move(custom_id);
  out->tokens = estimate_request_tokens(*norm);
  out->affinity = prefix_affinity(*norm);
  out->body = wire::to_json(std::move(norm).value()).dump();
  return std::nullopt;
}

}  // namespace hr::api
