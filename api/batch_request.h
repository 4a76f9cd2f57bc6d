// Validation and normalization of submitted requests, before anything is written. Pure functions:
// a bad request gives a Status naming the field (e.g. "messages[0].role") and the index of the
// first bad request in the batch.
#pragma once

#include <nlohmann/json.hpp>

#include <initializer_list>
#include <memory>
#include <string_view>

#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "base/status.h"
#include "queue/store.h"
#include "wire/chat_request.h"

namespace hr::api {

// The most bytes one token spans in the vocabularies served: a prompt of more bytes than the
// context's tokens times this cannot fit, and is refused at submit.
constexpr size_t kMaxBytesPerToken = 128;

struct ModelSpec {
  std::string name;
  int context_length = 2048;
};

struct BatchLimits {
  int max_requests = 100000;
  int max_stop_sequences = 4;
  int max_reference_length = 256;
};

struct BatchError {
  Status status;
  std::optional<int> index;
};

// Validates one chat request (Workers-AI / OpenAI fields) into the native request: messages (text
// parts joined) or a prompt, max_tokens (the model's default when absent), and the sampling
// fields the client set. `ordered`, when given, is the same request with its objects' keys in the
// client's order: schemas (a tool's parameters, response_format's) are taken from it, since the
// answer's properties are generated in the schema's order.
[[nodiscard]] Result<wire::ChatRequest> normalize_chat_request(
    const nlohmann::json& req, const ModelSpec& model, const BatchLimits& limits,
    const nlohmann::ordered_json* ordered = nullptr);

// The client's JSON text parsed with its keys in order, when it holds a schema that needs them
// (tools or response_format); null otherwise, or when it does not parse.
std::unique_ptr<nlohmann::ordered_json> ordered_schemas(std::string_view text);

// A batch's priority (queue/accounts.h's range) from the "priority" key of each place in turn (an
// object; null or anything else is passed over), the last one found winning; a bad one names its
// field with the place's prefix ("options.priority"). An integer, or its decimal text (OpenAI
// metadata holds strings only). None when no place has one.
struct PriorityPlace {
  const nlohmann::json* object;
  const char* prefix;
};
[[nodiscard]] Result<std::optional<int>> batch_priority(
    std::initializer_list<PriorityPlace> places);

// Checks the batch envelope: {"requests": [...]} with 1..max_requests elements.
[[nodiscard]] std::optional<BatchError> check_batch_envelope(const nlohmann::json& body,
                                                             const BatchLimits& limits);

// Validates request `i` of `reqs` into a store request, checking custom ids against `seen`
// (`ordered_reqs`: `reqs` with keys in order, see normalize_chat_request).
[[nodiscard]] std::optional<BatchError> parse_batch_request(
    const nlohmann::json& reqs, size_t i, const ModelSpec& model, const BatchLimits& limits,
    std::unordered_set<std::string>* seen, queue::NewRequest* out,
    const nlohmann::ordered_json* ordered_reqs = nullptr);

// Validates a whole {"requests": [...]} body into store requests; on error, names the index.
[[nodiscard]] std::optional<BatchError> parse_batch(const nlohmann::json& body,
                                                    const ModelSpec& model,
                                                    const BatchLimits& limits,
                                                    std::vector<queue::NewRequest>* out);

}  // namespace hr::api
