// Identifiers: UUIDs (v7 time-ordered for rows that are inserted in bulk, so B-tree inserts stay
// local; v4 where order must not leak), parsing, and random tokens for secrets. Thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"

namespace hr {

struct Uuid {
  std::array<uint8_t, 16> bytes{};
  // Canonical lowercase 8-4-4-4-12 form.
  std::string to_string() const;
  bool operator==(const Uuid&) const = default;
};

Uuid new_uuid_v4();
// Time-ordered: 48-bit unix milliseconds, then random bits (RFC 9562).
Uuid new_uuid_v7();
// Accepts the canonical 36-character form, either case. Anything else is an error.
[[nodiscard]] Result<Uuid> parse_uuid(std::string_view text);

// Cryptographically random bytes from the kernel (getrandom).
void random_bytes(uint8_t* out, size_t n);
// `n` random bytes as lowercase hex (2n characters).
std::string random_hex(size_t n);

}  // namespace hr
