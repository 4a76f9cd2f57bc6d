// Hashes and encodings: SHA-256 (API key storage, idempotency fingerprints), HMAC-SHA256 (webhook
// signatures), hex and base64. Stateless and thread-safe (OpenSSL's one-shot functions).
#pragma once

#include <cstdint>
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

// Fast non-cryptographic hashes, for placing work (not for anything an attacker may aim at):
// 64-bit FNV-1a of `data` continuing from `h`, and a 64-bit finalizer that spreads every input
// bit over the output (splitmix64's).
inline constexpr uint64_t kFnv1aOffset = 0xcbf29ce484222325ULL;
uint64_t fnv1a64(std::string_view data, uint64_t h = kFnv1aOffset);
uint64_t mix64(uint64_t x);
// Rendezvous (highest random weight) hashing: each node's score for `key`; the node with the
// highest score owns the key, and removing a node moves only its own keys (to their next-ranked
// nodes).
uint64_t rendezvous_score(std::string_view key, std::string_view node);

}  // namespace hr
