// UUID generation and parsing on top of getrandom(2).
#include "base/ids.h"

#include <sys/random.h>

#include <cerrno>
#include <chrono>

namespace hr {
namespace {

constexpr char kHex[] = "0123456789abcdef";

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

void random_bytes(uint8_t* out, size_t n) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = getrandom(out + done, n - done, 0);
    if (r < 0) {
      HR_CHECK(errno == EINTR) << "getrandom failed: errno=" << errno;
      continue;
    }
    done += static_cast<size_t>(r);
  }
}

std::string random_hex(size_t n) {
  std::string raw(n, '\0');
  random_bytes(reinterpret_cast<uint8_t*>(raw.data()), n);
  std::string out;
  out.reserve(2 * n);
  for (unsigned char c : raw) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

std::string Uuid::to_string() const {
  std::string s;
  s.reserve(36);
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    s += kHex[bytes[i] >> 4];
    s += kHex[bytes[i] & 15];
  }
  return s;
}

Uuid new_uuid_v4() {
  Uuid u;
  random_bytes(u.bytes.data(), 16);
  u.bytes[6] = (u.bytes[6] & 0x0f) | 0x40;
  u.bytes[8] = (u.bytes[8] & 0x3f) | 0x80;
  return u;
}

Uuid new_uuid_v7() {
  Uuid u;
  random_bytes(u.bytes.data(), 16);
  uint64_t ms = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          std::chrono::system_clock::now().time_since_epoch())
                                          .count());
  for (int i = 0; i < 6; ++i) u.bytes[i] = static_cast<uint8_t>(ms >> (40 - 8 * i));
  u.bytes[6] = (u.bytes[6] & 0x0f) | 0x70;
  u.bytes[8] = (u.bytes[8] & 0x3f) | 0x80;
  return u;
}

Result<Uuid> parse_uuid(std::string_view text) {
  if (text.size() != 36) {
    return invalid_argument("not a UUID: expected 36 characters in 8-4-4-4-12 form");
  }
  Uuid u;
  int byte = 0;
  for (size_t i = 0; i < 36;) {
    if (i == 8 || i == 13 || i == 18 || i == 23) {
      if (text[i] != '-')
        return invalid_argument("not a UUID: expected '-' at position " + std::to_string(i));
      ++i;
      continue;
    }
    int hi = hex_value(text[i]);
    int lo = hex_value(text[i + 1]);
    if (hi < 0 || lo < 0) return invalid_argument("not a UUID: non-hex character");
    u.bytes[byte++] = static_cast<uint8_t>(hi << 4 | lo);
    i += 2;
  }
  return u;
}

}  // namespace hr
