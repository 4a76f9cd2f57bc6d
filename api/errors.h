// The one place where a Status becomes an HTTP status and a JSON error body:
//   {"success": false, "errors": [{"code": 1001, "message": "...", "field": "...", "index": 3}],
//    "messages": [], "result": null}
// or, on the OpenAI-shaped routes (/v1/chat/completions, /v1/models, /v1/files, /v1/batches), the
// shape OpenAI's SDKs parse:
//   {"error": {"message": "...", "type": "invalid_request_error", "param": "...", "code": "..."}}
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>

#include "api/http_server.h"
#include "base/status.h"

namespace hr::api {

int http_status_for(StatusCode code);
// Stable numeric error codes for clients (3040 is Workers AI's "Out of capacity").
int error_code_for(StatusCode code);
nlohmann::json error_body(const Status& status, std::optional<int> index = std::nullopt);
// OpenAI's error shape: `param` is the Status's field (null when none), `code` a stable string
// (the Status code's name unless given), `type` OpenAI's error class for the HTTP status.
nlohmann::json openai_error_body(const Status& status,
                                 std::optional<std::string> code = std::nullopt);

// JSON text from a client, parsed (json::parse with exceptions off): discarded (is_discarded())
// when malformed, or when it nests deeper than kMaxJsonDepth (copying or printing a document
// recurses once per level: a deep one would overflow the stack) or holds a NUL character in a
// string (Postgres cannot store one). `why` (may be null) then says which, as "nests deeper than
// 64 levels", "holds a NUL character (\u0000)" or "is not valid JSON".
constexpr int kMaxJsonDepth = 64;
nlohmann::json parse_client_json(std::string_view text, std::string* why = nullptr);

// The error as an HTTP response (Retry-After: 1 on retryable ones).
HttpResponse error_response(const Status& status, std::optional<int> index = std::nullopt);
// A success in the Cloudflare envelope: {"result": ..., "success": true, "errors": [], ...}.
HttpResponse ok_response(nlohmann::json result, unsigned status = 200);

}  // namespace hr::api
