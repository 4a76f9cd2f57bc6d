// Sorting the vocabulary once per model.
#include "grammar/vocabulary.h"

#include <algorithm>

namespace hr::grammar {

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
  stop_ids_.erase(std::remove_if(stop_ids_.begin(), stop_ids_.end(),
                                 [&](int32_t id) { return id < 0 || id >= mask_size_; }),
                  stop_ids_.end());
}

bool Vocabulary::is_stop(int32_t id) const {
  return std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end();
}

}  // namespace hr::grammar
