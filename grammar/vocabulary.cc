// Sorting the vocabulary once per model.
#include "grammar/vocabulary.h"

#include <algorithm>

namespace hr::grammar {

namespace {

// The number of characters of `s` when it is whole, well-formed UTF-8 with no quote, backslash or
// control character; else -1.
int count_plain_chars(const std::string& s) {
  int n = 0;
  for (size_t i = 0; i < s.size(); ++n) {
    const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
    const unsigned char c = b(i);
    if (c < 0x80) {
      if (c < 0x20 || c == '"' || c == '\\') return -1;
      ++i;
      continue;
    }
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return -1;
    }
    if (i + len > s.size()) return -1;
    if (b(i + 1) < lo || b(i + 1) > hi) return -1;
    for (size_t k = 2; k < len; ++k) {
      if (b(i + k) < 0x80 || b(i + k) > 0xBF) return -1;
    }
    i += len;
  }
  return n;
}

}  // namespace

Vocabulary::Vocabulary(std::vector<std::string> token_bytes, const std::vector<bool>& usable,
                       std::vector<int32_t> stop_ids, int mask_size)
    : bytes_(std::move(token_bytes)),
      stop_ids_(std::move(stop_ids)),
      mask_size_(std::max(mask_size, static_cast<int>(bytes_.size()))) {
  for (size_t id = 0; id < bytes_.size(); ++id) {
    if (id < usable.size() && usable[id] && !bytes_[id].empty() &&
        !is_stop(static_cast<int32_t>(id)))
      sorted_.push_back(static_cast<int32_t>(id));
  }
  std::sort(sorted_.begin(), sorted_.end(), [&](int32_t a, int32_t b) {
    return bytes(a) < bytes(b) || (bytes(a) == bytes(b) && a < b);
  });
  lcp_.resize(sorted_.size(), 0);
  for (size_t i = 1; i < sorted_.size(); ++i) {
    const std::string& a = bytes(sorted_[i - 1]);
    const std::string& b = bytes(sorted_[i]);
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n] && n < 65535) ++n;
    lcp_[i] = static_cast<uint16_t>(n);
  }
  plain_chars_.assign(bytes_.size(), -1);
  int longest = 0;
  for (int32_t id : sorted_) {
    const int n = count_plain_chars(bytes(id));
    if (n > 0 && n < 4096) {
      plain_chars_[static_cast<size_t>(id)] = static_cast<int16_t>(n);
      longest = std::max(longest, n);
    }
  }
  plain_masks_.resize(static_cast<size_t>(longest) + 1);
  for (int32_t id : sorted_) {
    const int n = plain_chars_[static_cast<size_t>(id)];
    if (n <= 0) continue;
    std::vector<uint32_t>& m = plain_masks_[static_cast<size_t>(n)];
    if (m.empty()) m.assign(static_cast<size_t>(mask_words()), 0);
    m[static_cast<size_t>(id) >> 5] |= 1u << (id & 31);
  }
  stop_ids_.erase(std::remove_if(stop_ids_.begin(), stop_ids_.end(),
                                 [&](int32_t id) { return id < 0 || id >= mask_size_; }),
                  stop_ids_.end());
}

bool Vocabulary::is_stop(int32_t id) const {
  return std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end();
}

}  // namespace hr::grammar
