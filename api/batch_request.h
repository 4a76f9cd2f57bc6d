// Validation and normalization of submitted requests, before anything is written. Pure functions:
// a bad request gives a Status naming the field (e.g. "messages[0].role") and the index of the
// first bad request in the batch.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "base/status.h"
#include "queue/store.h"
#include "wire/chat_request.h"

namespace hr::api {

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
// fields the client set.
[[nodiscard]] Result<wire::ChatRequest> normalize_chat_request(const nlohmann::json& req,
                                                               const ModelSpec& model,
                                                               const BatchLimits& limits);

// Checks the batch envelope: {"requests": [...]} with 1..max_requests elements.
[[nodiscard]] std::optional<BatchError> check_batch_envelope(const nlohmann::json& body,
                                                             const BatchLimits& limits);

// Validates request `i` of `reqs` into a store request, checking custom ids against `seen`.
[[nodiscard]] std::optional<BatchError> parse_batch_request(const nlohmann::json& reqs, size_t i,
                                                            const ModelSpec& model,
                                                            const BatchLimits& limits,
                                                            std::unordered_set<std::string>* seen,
                                                            queue::NewRequest* out);

// Validates a whole {"requests": [...]} body into store requests; on error, names the index.
[[nodiscard]] std::optional<BatchError> parse_batch(const nlohmann::json& body,
                                                    const ModelSpec& model,
                                                    const BatchLimits& limits,
                                                    std::vector<queue::NewRequest>* out);

}  // namespace hr::api
