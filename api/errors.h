// The API's JSON error bodies and responses (the HTTP status of each comes from
// http::http_status_for):
//   {"success": false, "errors": [{"code": 1001, "message": "...", "field": "...", "index": 3}],
//    "messages": [], "result": null}
// or, on the OpenAI-shaped routes (/v1/chat/completions, /v1/models, /v1/files, /v1/batches), the
// shape OpenAI's SDKs parse:
//   {"error": {"message": "...", "type": "invalid_request_error", "param": "...", "code": "..."}}
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

#include "base/status.h"
#include "http/server.h"

namespace hr::api {

// A store's answer that refuses the request as the client made it (a reused Idempotency-Key, a
// quota reached), not a failure of the store: answered as it is (409, 429 with Retry-After).
inline bool is_refusal(const Status& st) {
  return st.code() == StatusCode::kConflict || st.code() == StatusCode::kResourceExhausted;
}

// Stable numeric error codes for clients (3040 is Workers AI's "Out of capacity").
int error_code_for(StatusCode code);
nlohmann::json error_body(const Status& status, std::optional<int> index = std::nullopt);
// OpenAI's error shape: `param` is the Status's field (null when none), `code` a stable string
// (the Status code's name unless given), `type` OpenAI's error class for the HTTP status.
nlohmann::json openai_error_body(const Status& status,
                                 std::optional<std::string> code = std::nullopt);

// The error as an HTTP response (Retry-After: 1 on retryable ones).
http::HttpResponse error_response(const Status& status, std::optional<int> index = std::nullopt);
// The same in OpenAI's shape, for the OpenAI routes.
http::HttpResponse openai_error_response(const Status& status);
// A success in the Cloudflare envelope: {"result": ..., "success": true, "errors": [], ...}.
http::HttpResponse ok_response(nlohmann::json result, unsigned status = 200);

}  // namespace hr::api
