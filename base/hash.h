// Hashes and encodings: SHA-256 (API key storage, idempotency fingerprints), HMAC-SHA256 (webhook
// signatures), hex and base64. Stateless and thread-safe (OpenSSL's one-shot functions).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace hr {

std::string sha256(std::string_view data);                             // 32 raw bytes
std::string hmac_sha256(std::string_view key, std::string_view data);  // 32 raw bytes
std::string to_hex(std::string_view bytes);
std::string base64_encode(std::string_view bytes);
// Standard base64 (with padding); nullopt when `text` is not valid base64.
std::optional<std::string> base64_decode(std::string_view text);

}  // namespace hr
