// Secrets at rest (webhook signing secrets): sealed with AES-256-GCM under the process's
// key-encryption key before they are written, opened when read, so that a copy of the database
// (a backup, a replica, a leaked dump) does not hold them. The key is 32 random bytes in a file
// (64 hex digits), given with --secret-key-file or HEADROOM_SECRET_KEY_FILE; every process on one
// database needs the same file. Without a key, values are stored as given (and a process says so
// at start). Values stored before a key was set read as they are. Thread-safe.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"

namespace hr::secrets {

// Reads the key file (64 hex digits, whitespace around them ignored) and makes it the
// process's key. kInvalidArgument naming "secret-key-file" when it cannot be read or is not a key.
[[nodiscard]] Status load_key_file(const std::string& path);
// The key from HEADROOM_SECRET_KEY_FILE when no key was loaded yet and it is set (once per
// process; also done on the first seal or open).
[[nodiscard]] Status load_key_from_env();
// For tests: sets or forgets the key (32 bytes).
void set_key(std::string_view key);
void clear_key();
bool has_key();

// 64 hex digits of a new random key, for a key file.
std::string new_key_text();

// "hrenc1:" then base64 of a random 12-byte nonce, the ciphertext and the 16-byte tag; the
// value unchanged when there is no key.
std::string seal(std::string_view plaintext);
// The plaintext of a sealed value; a value without the prefix as it is. kFailedPrecondition when
// it is sealed and there is no key, kInternal when the key does not open it (another key, or
// altered).
[[nodiscard]] Result<std::string> open(std::string_view stored);
// Whether `stored` is sealed.
bool is_sealed(std::string_view stored);

}  // namespace hr::secrets
