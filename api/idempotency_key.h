// The Idempotency-Key header of a submit, a batch creation or a retry: a repeated call with the
// same key (and the same request) answers what the first one made instead of making another.
#pragma once

#include <optional>
#include <string>

#include "base/status.h"
#include "http/server.h"

namespace hr::api {

// The header's value (none when absent); an empty or over-long one is an error naming the header.
[[nodiscard]] Result<std::optional<std::string>> idempotency_key(const http::HttpRequest& req);

}  // namespace hr::api
