// The Idempotency-Key header.
#include "api/idempotency_key.h"

namespace hr::api {

Result<std::optional<std::string>> idempotency_key(const http::HttpRequest& req) {
  auto it = req.find("Idempotency-Key");
  if (it == req.end()) return std::optional<std::string>();
  std::string key(it->value());
  if (key.empty() || key.size() > 255) {
    return invalid_argument("Idempotency-Key must be 1 to 255 characters", "Idempotency-Key");
  }
  return std::optional<std::string>(std::move(key));
}

}  // namespace hr::api
