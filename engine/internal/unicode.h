// UTF-8 and the bits of Unicode the tokenizer needs (internal to engine/): code point decoding,
// lossy conversion to valid UTF-8 that can hold back an unfinished character, the letter /
// number / whitespace classes of the pre-tokenizer regexes, word characters, and NFC. Stateless;
// thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace hr::engine::internal {

constexpr uint32_t kReplacementChar = 0xFFFD;

void append_utf8(std::string& out, uint32_t cp);
// The code point at s[i] and its length in bytes; an ill-formed sequence reads as U+FFFD, 1 byte.
uint32_t decode_utf8(std::string_view s, size_t i, int* len);

// Appends `bytes` to `out` as valid UTF-8: each maximal ill-formed subsequence becomes U+FFFD (as
// in the WHATWG decoder and Rust's from_utf8_lossy). Unless `final`, a character cut off by the end
// of `bytes` is held back: returns how many bytes were consumed.
size_t append_valid_utf8(std::string_view bytes, bool final, std::string* out);

// \p{L}, \p{N} and \s of the pre-tokenizer regexes. \s is Oniguruma's (the Rust tokenizers'):
// it has U+0085 and lacks U+FEFF, unlike JavaScript's.
bool is_letter(uint32_t cp);
bool is_number(uint32_t cp);
bool is_whitespace(uint32_t cp);
// \w as Rust's regex crate has it (Alphabetic, marks, decimal digits, connector punctuation, join
// controls): the word characters of Hugging Face tokenizers' single_word added tokens.
bool is_word_char(uint32_t cp);

// Replaces every `from` (non-empty) in `s` by `to`.
void replace_all(std::string& s, std::string_view from, std::string_view to);

// Unicode normalization form C. Text that is not valid UTF-8 comes back unchanged.
std::string nfc(std::string_view text);

}  // namespace hr::engine::internal
